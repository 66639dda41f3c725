"""What a convseq checkpoint records about the data it was trained on, and comparing two records.

A training checkpoint holds the full plain ``data`` config of its run under
``datamodule_hyper_parameters["data"]`` (name, corpus folder, language pair, segmentation and
dictionary settings, ...) and the segmentation itself under `TEXT_KEY`. Generation takes its
data from there unless the user gives other data, and averaging keeps it; fairseq checkpoints
and those of task=import_fairseq record no data (`training_data` is None for them).

The settings compared (`IDENTITY`) are the ones that decide how text becomes the model's ids:
the language pair, the subword segmentation and the dictionary construction. The corpus folder
may differ (the same corpus on another machine); the dictionaries themselves are compared by
whoever holds them (`convseq.inference.data_match`, `convseq.checkpoints.average`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from convseq.checkpoints.io import TEXT_KEY

__all__ = [
    "DATA_HPARAMS",
    "IDENTITY",
    "data_differences",
    "describe",
    "pair_of",
    "segmentation_differs",
    "text_record",
    "training_data",
]

DATA_HPARAMS = "datamodule_hyper_parameters"  # Lightning's key of the data module's hparams
# Data settings that must agree between a model and the data it translates or is averaged with
IDENTITY = ("src_lang", "tgt_lang", "subword", "vocab")
# Keys that older checkpoints record and that are no longer data settings, left out of the record
# so that it is a data config of today (batch_tokens: the token budget is batching.max_tokens)
REMOVED = ("batch_tokens",)


def training_data(ckpt: Mapping[str, Any]) -> dict | None:
    """The plain ``data`` config a training checkpoint was trained on; None when not recorded.
    Settings since removed (`REMOVED`) are left out."""
    hparams = ckpt.get(DATA_HPARAMS)
    data = hparams.get("data") if isinstance(hparams, Mapping) else None
    if not isinstance(data, Mapping):
        return None
    return {key: value for key, value in data.items() if key not in REMOVED}


def pair_of(data: Mapping[str, Any] | None, text: Mapping[str, Any] | None) -> tuple | None:
    """(source, target) language of a data config, else of a `TEXT_KEY` entry; None if neither."""
    for record in (data, text):
        if record and record.get("src_lang") and record.get("tgt_lang"):
            return str(record["src_lang"]), str(record["tgt_lang"])
    return None


def describe(data: Mapping[str, Any] | None, text: Mapping[str, Any] | None = None) -> str:
    """``"de->en (multi30k)"``: the pair and the corpus name, as messages name a data config."""
    pair = pair_of(data, text)
    arrow = f"{pair[0]}->{pair[1]}" if pair else "an unrecorded language pair"
    name = (data or {}).get("name")
    return f"{arrow} ({name})" if name else arrow


def _flat(value: Any, prefix: str) -> dict[str, Any]:
    """``{"subword.type": "bpe", ...}``: nested settings as dotted keys."""
    if not isinstance(value, Mapping):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, sub in value.items():
        out.update(_flat(sub, f"{prefix}.{key}"))
    return out


def _identity(data: Mapping[str, Any]) -> dict[str, Any]:
    """The `IDENTITY` settings of a data config, as dotted keys.

    Without subwords (``subword.type: none``) the other subword settings are unused, so only
    the type counts.
    """
    out: dict[str, Any] = {}
    for key in IDENTITY:
        if key not in data:
            continue
        value = data[key]
        if key == "subword" and isinstance(value, Mapping) and value.get("type") == "none":
            value = {"type": "none"}
        out.update(_flat(value, key))
    return out


def data_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``[(data key, a's value, b's value)]`` of the `IDENTITY` settings that differ.

    A key recorded on one side only is not a difference (a checkpoint written before the key
    existed); subword settings other than the type are compared only when subwords are used.
    """
    left, right = _identity(a), _identity(b)
    keys = [k for k in left if k in right]
    if "subword.type" in keys and left["subword.type"] != right["subword.type"]:
        keys = [k for k in keys if not k.startswith("subword.") or k == "subword.type"]
    return [(k, left[k], right[k]) for k in keys if left[k] != right[k]]


def segmentation_differs(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[str]:
    """The sides (``"source"``, ``"target"``) whose recorded sentencepiece models differ.

    ``a`` and ``b`` are `TEXT_KEY` entries; a missing entry (None) is not compared.
    """
    if a is None or b is None:
        return []
    return [
        side
        for side, key in (("source", "src_spm"), ("target", "tgt_spm"))
        if a.get(key) != b.get(key)
    ]


def text_record(ckpt: Mapping[str, Any]) -> dict | None:
    """The checkpoint's segmentation entry (`TEXT_KEY`), or None."""
    text = ckpt.get(TEXT_KEY)
    return dict(text) if isinstance(text, Mapping) else None
