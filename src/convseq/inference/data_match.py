"""Which data a checkpoint translates, and the refusal of data it was not trained on.

A convseq checkpoint records the ``data`` config of its training run and its segmentation
(`convseq.checkpoints.data_record`). Generation takes the data from there when the user gives
none (``data=None``: `data_to_translate`), and checks data the user does give: first its
settings (`check_given_data`: language pair, subword and dictionary settings), then the
data-bin built from it (`check_databin`: language pair, dictionaries, sentencepiece models).
A mismatch is refused naming both sides, e.g. ``checkpoint de->en (multi30k), data src->tgt
(toy)``, with what to do. Checkpoints that record nothing (fairseq's, task=import_fairseq's)
are translated as before, with the data the user names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convseq.checkpoints.data_record import (
    data_differences,
    describe,
    pair_of,
    segmentation_differs,
)
from convseq.common.config import plain, typed
from convseq.data.base_databin import BaseDataBin
from convseq.data.config import DataConfig
from convseq.data.dictionary import Dictionary
from convseq.errors import CheckpointError
from convseq.inference.errors import DataMismatchError
from convseq.inference.loading import LoadedModel

__all__ = [
    "TrainedOn",
    "check_databin",
    "check_given_data",
    "data_to_translate",
    "split_given",
    "trained_on",
]

# the way to translate text of another corpus with a model's own segmentation, whatever the data
OTHER_TEXT = "to translate other text with this model, use gen.input=FILE [gen.reference=FILE]"


@dataclass(frozen=True)
class TrainedOn:
    """What a Translator's checkpoints record about their training data.

    Attributes:
        checkpoints: the checkpoint paths, for messages.
        data: the plain data config they were trained on; None when none records it.
        text: their segmentation entry (`convseq.checkpoints.io.TEXT_KEY`), or None.
    """

    checkpoints: tuple[str, ...]
    data: dict | None
    text: dict | None

    @property
    def name(self) -> str:
        """How messages name the checkpoint(s)."""
        return " + ".join(self.checkpoints)

    def describe(self) -> str:
        return describe(self.data, self.text)


def trained_on(loaded: Sequence[LoadedModel], paths: Sequence[Any]) -> TrainedOn:
    """The training data the checkpoints agree on (an ensemble must agree on it).

    Members that record no data (fairseq checkpoints) are not compared.

    Raises:
        CheckpointError: two members were trained on other data (pair, segmentation settings or
            sentencepiece models); both are named.
    """
    first = None
    for path, member in zip(paths, loaded):
        if member.data is None and member.text is None:
            continue
        if first is None:
            first = (path, member)
            continue
        why = _differences(first[1].data, first[1].text, member.data, member.text)
        if why:
            raise CheckpointError(
                f"{path} was trained on {describe(member.data, member.text)}, {first[0]} on "
                f"{describe(first[1].data, first[1].text)} ({'; '.join(why)}): ensemble members "
                "must be trained on the same data"
            )
    names = tuple(str(p) for p in paths)
    if first is None:
        return TrainedOn(names, None, None)
    return TrainedOn(names, first[1].data, first[1].text)


def _differences(
    data_a: Mapping | None, text_a: Mapping | None, data_b: Mapping | None, text_b: Mapping | None
) -> list[str]:
    """What differs between two records: pair, data settings, sentencepiece models."""
    pair_a, pair_b = pair_of(data_a, text_a), pair_of(data_b, text_b)
    why = []
    if pair_a and pair_b and pair_a != pair_b:
        why.append(f"language pair {pair_a[0]}->{pair_a[1]} vs {pair_b[0]}->{pair_b[1]}")
    if data_a is not None and data_b is not None:
        for key, va, vb in data_differences(data_a, data_b):
            if key not in ("src_lang", "tgt_lang"):  # the pair is named above
                why.append(f"data.{key}: {va!r} vs {vb!r}")
    why += [f"the {side} sentencepiece model" for side in segmentation_differs(text_a, text_b)]
    return why


def _refuse(model: TrainedOn, data: str, why: Sequence[str], fix: str) -> DataMismatchError:
    return DataMismatchError(
        f"checkpoint {model.describe()}, data {data}: {model.name} was trained on other data "
        f"({'; '.join(why)}); {fix}"
    )


def check_given_data(model: TrainedOn, data: Mapping[str, Any]) -> None:
    """Refuse a data config the user gave whose pair or segmentation/dictionary settings are not
    the checkpoint's. Nothing is built: this runs before any data-bin is."""
    if model.data is None and model.text is None:
        return  # nothing recorded: the user's data is all there is
    why = _differences(model.data, model.text, data, None)
    if why:
        raise _refuse(
            model,
            describe(data),
            why,
            f"leave data out to use the checkpoint's own ({model.describe()}), or give data "
            f"of that corpus; {OTHER_TEXT}",
        )


def split_given(data: Mapping[str, Any] | None) -> tuple[dict | None, dict | None]:
    """A checkpoint task's `data` node as (a data config given whole, keys given alone).

    A data option (`data=NAME`) always sets `name`: the node is then a corpus of its own; keys
    without it (`data.dir=...`) change the checkpoint's data; nothing means the checkpoint's.
    """
    if not data:
        return None, None
    given = plain(data)
    return (given, None) if "name" in given else (None, given)


def data_to_translate(
    model: TrainedOn,
    given: Mapping[str, Any] | None,
    overrides: Mapping[str, Any] | None = None,
) -> DataConfig:
    """The data config whose split generation translates.

    Args:
        model: what the checkpoints record.
        given: the user's data config, or None when the user gave none (the checkpoint's).
        overrides: with `given` None, keys the user set on the checkpoint's data (nested, e.g.
            ``{"dir": "/corpora/multi30k"}`` from ``data.dir=...``): the result is checked as
            given data.

    A generated corpus (the toy one) that is not in a folder of this machine is generated
    again in the generator's own folder of the cache (its ``dir`` is left unset:
    `convseq.data.corpus_dir`).

    Raises:
        DataMismatchError: the given data does not match (`check_given_data`); or none was given
            and the checkpoint records none, or its corpus folder is not on this machine.
    """
    if given is None and overrides and model.data is not None:
        given = merged(model.data, overrides)
    if given is not None:
        check_given_data(model, given)
        return typed(DataConfig, given, "data", DataMismatchError)
    if model.data is None:
        raise DataMismatchError(
            f"{model.name} records no training data (a fairseq checkpoint or task=import_"
            "fairseq's): give the data whose split to translate with data=NAME (and "
            "data.dir=FOLDER), or translate a text file with gen.input=FILE"
        )
    # the record without the settings since removed (convseq.checkpoints.data_record)
    data = typed(DataConfig, model.data, "data", DataMismatchError)
    if data.format == "fairseq":  # a fairseq-preprocess folder, read where it is
        folder = Path(data.path or "").expanduser()
        if data.path and folder.is_dir():
            return data
        raise DataMismatchError(
            f"{model.name} was trained on the fairseq data-bin {folder}, a folder that is not on "
            "this machine: give where it is here with data.path=FOLDER (the checkpoint's other "
            f"data settings are kept); {OTHER_TEXT}"
        )
    corpus = Path(data.dir or "").expanduser()
    if data.dir and corpus.is_dir():
        return data
    if data.generator:  # same seed, same bytes: generated again into this cache's folder
        return dataclasses.replace(data, dir=None)  # unset: the generator writes its own
    raise DataMismatchError(
        f"{model.name} was trained on {model.describe()} from {corpus}, a folder that is not on "
        "this machine: give where that corpus is here with data.dir=FOLDER (the checkpoint's "
        f"other data settings are kept); {OTHER_TEXT}"
    )


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s values put in, nested mappings merged key by key."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def check_databin(
    model: TrainedOn,
    databin: BaseDataBin,
    dicts: tuple[Dictionary, Dictionary],
    given: bool,
) -> None:
    """Refuse a data-bin that is not the checkpoint's data: another language pair, other
    dictionaries or another sentencepiece model than those the checkpoint records.

    Args:
        model: what the checkpoints record (nothing recorded: nothing is checked).
        databin: the data-bin whose split is translated.
        dicts: the models' (source, target) dictionaries.
        given: whether the user gave the data (else it is the checkpoint's own).
    """
    if model.data is None and model.text is None:
        return
    arrow = f"{databin.src_lang}->{databin.tgt_lang}"
    pair = pair_of(model.data, model.text)
    why = []
    if pair and pair != (databin.src_lang, databin.tgt_lang):
        why.append(f"language pair {pair[0]}->{pair[1]} vs {arrow}")
    if model.data is not None:  # a convseq training checkpoint: its dictionaries are its data's
        theirs_both = (databin.src_dict, databin.tgt_dict)
        for side, mine, theirs in zip(("source", "target"), dicts, theirs_both):
            if mine != theirs:
                why.append(f"the {side} dictionary: {len(mine)} vs {len(theirs)} symbols")
    segmentation = databin.text_processing() if model.text is not None else None
    why += [
        f"the {side} sentencepiece model" for side in segmentation_differs(model.text, segmentation)
    ]
    if model.text is not None and segmentation is not None:  # a fairseq data-bin's joiner
        mine, theirs = model.text.get("remove_bpe"), segmentation.get("remove_bpe")
        if mine != theirs:
            why.append(f"data.remove_bpe: {mine!r} vs {theirs!r}")
    if not why:
        return
    fix = (
        f"leave data out to use the checkpoint's own ({model.describe()})"
        if given
        else "the corpus files or the preprocessing changed since training: give the corpus "
        "it was trained on with data=NAME data.dir=FOLDER"
    )
    raise _refuse(model, f"{arrow} (data-bin {databin.path})", why, f"{fix}; {OTHER_TEXT}")
