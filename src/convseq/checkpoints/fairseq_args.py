"""What every family's fairseq arguments share: where a checkpoint keeps them, its architecture
name, the language pair, typed reading of single values, and the args / cfg written back.

fairseq stores a model's arguments as an ``argparse.Namespace``: ``state["args"]`` in files
written before fairseq 0.10, ``state["cfg"]["model"]`` (with ``_name`` = the arch) after it.
Each family's reading and writing of its own arguments is its `FairseqAdapter`
(`convseq.checkpoints.fairseq_adapters`).
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from convseq.errors import CheckpointError

DEFAULT_MAX_POSITIONS = 1024  # fairseq's translation task default for both sides
FAIRSEQ_PAD = 1  # the pad index of every fairseq Dictionary


@dataclass(frozen=True)
class FairseqAdapter:
    """One model family's side of fairseq's checkpoints.

    Attributes:
        family: the family's name (`convseq.models.family.FAMILIES`).
        archs: fairseq's registered architecture names this family reads.
        base_arch: the name written for a convseq preset fairseq does not register (every
            argument is written explicitly, so the base's defaults never apply).
        config: (checkpoint dict with plain args/cfg, its model state) -> the typed config,
            fairseq's defaults for the named architecture filled in as fairseq fills them.
        model_args: typed config -> fairseq's model arguments (without the task's).
        upgrade: (model state, config, file) -> the state in the layout the model loads
            strictly (old layouts converted, entries fairseq itself ignores dropped).
        joined_dictionary: whether the config needs one dictionary for both sides.
    """

    family: str
    archs: tuple[str, ...]
    base_arch: str
    config: Callable[[Mapping[str, Any], Mapping[str, torch.Tensor]], Any]
    model_args: Callable[[Any], dict[str, Any]]
    upgrade: Callable[[Mapping[str, torch.Tensor], Any, Path], OrderedDict[str, torch.Tensor]]
    joined_dictionary: Callable[[Any], bool]

    def arch_to_write(self, arch: str) -> str:
        """fairseq's name for a config's arch: its own when fairseq registers it, else the base."""
        return arch if arch in self.archs else self.base_arch


def get_arg(obj: Any, key: str) -> Any:
    """A field of a Namespace or a mapping; None when absent."""
    if isinstance(obj, argparse.Namespace):
        return getattr(obj, key, None)
    if isinstance(obj, Mapping):
        return obj.get(key)
    return None


def model_args(state: Mapping[str, Any]) -> tuple[Any, str]:
    """The model's arguments (a Namespace or mapping) and where they were found.

    ``state`` is the checkpoint dict with its ``args``/``cfg`` already made plain.
    """
    args = state.get("args")
    if isinstance(args, (argparse.Namespace, Mapping)):
        return args, "args"
    theirs = state.get("cfg")  # fairseq's own config, as its checkpoint holds it
    if isinstance(theirs, Mapping):
        model = theirs.get("model")
        if isinstance(model, (argparse.Namespace, Mapping)):
            return model, "cfg.model"
        raise CheckpointError(
            f"the checkpoint's cfg has no model section (cfg keys: {sorted(theirs)})"
        )
    raise CheckpointError(
        "the checkpoint has neither 'args' nor 'cfg' describing the model "
        f"(top-level keys: {sorted(state)})"
    )


def arch_of(state: Mapping[str, Any]) -> str:
    """The architecture name the checkpoint's model arguments give (``arch`` or ``_name``)."""
    args, where = model_args(state)
    arch = get_arg(args, "arch") or get_arg(args, "_name")
    if not isinstance(arch, str):
        raise CheckpointError(f"{where}: no 'arch' (or '_name') naming the model's architecture")
    return arch


def task_args(state: Mapping[str, Any]) -> Any:
    """The task section of a cfg-form checkpoint; None in the args form."""
    theirs = state.get("cfg")
    return theirs.get("task") if isinstance(theirs, Mapping) else None


def max_positions(state: Mapping[str, Any], side: str, label: str) -> int:
    """``max_<side>_positions``: the model arguments', else the task's, else the one
    ``max_positions`` of files from before 2018, else fairseq's 1024."""
    args, _ = model_args(state)
    key = f"max_{side}_positions"
    value = get_arg(args, key)
    if value is None:
        value = get_arg(task_args(state), key)
    if value is None:
        value = get_arg(args, "max_positions")
    return as_number(DEFAULT_MAX_POSITIONS if value is None else value, int, label + key)


def as_bool(value: Any, key: str) -> bool:
    """A boolean as fairseq's parsers store it: a bool, "True"/"False", or 0/1."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise CheckpointError(f"{key}: expected a boolean, got {value!r}")


def as_number(value: Any, kind: type, key: str) -> Any:
    """``kind(value)``, a CheckpointError naming ``key`` when it is not one."""
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise CheckpointError(f"{key}: expected {kind.__name__}, got {value!r}") from None


def language_pair(state: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(source, target) language codes from ``args``, ``cfg.task`` or ``cfg.model``."""
    places = [state.get("args")]
    theirs = state.get("cfg")  # fairseq's own config
    if isinstance(theirs, Mapping):
        places += [theirs.get("task"), theirs.get("model")]
    src = tgt = None
    for place in places:
        src = src or get_arg(place, "source_lang")
        tgt = tgt or get_arg(place, "target_lang")
    return src, tgt


# -- the other direction: a family's model arguments -> fairseq's args / cfg --------------------


def fairseq_args(
    model: Mapping[str, Any], src_lang: str, tgt_lang: str, data: str
) -> argparse.Namespace:
    """A flat ``args`` Namespace as fairseq (before 0.10) saved it: task and model together.

    Booleans of the translation task are the strings fairseq's parser stores ("True"), which
    older releases read with ``eval``.
    """
    return argparse.Namespace(
        task="translation",
        data=data,
        source_lang=src_lang,
        target_lang=tgt_lang,
        left_pad_source="True",
        left_pad_target="False",
        **model,
    )


def fairseq_cfg(
    model: Mapping[str, Any], src_lang: str, tgt_lang: str, data: str
) -> dict[str, Any]:
    """A ``cfg`` as fairseq >= 0.10.2 saves it (a plain container), for an argparse model.

    ``model`` is the flat Namespace with ``_name`` = the arch, as fairseq's
    ``convert_namespace_to_omegaconf`` makes it for models without a dataclass; ``task`` holds
    fields of fairseq's TranslationConfig only (fairseq merges it into that dataclass).
    """
    namespace = fairseq_args(model, src_lang, tgt_lang, data)
    namespace._name = namespace.arch
    task = {
        "_name": "translation",
        "data": data,
        "source_lang": src_lang,
        "target_lang": tgt_lang,
        "left_pad_source": True,
        "left_pad_target": False,
        "max_source_positions": int(model["max_source_positions"]),
        "max_target_positions": int(model["max_target_positions"]),
    }
    # the registry sections fairseq writes as None when unused
    unused: Sequence[str] = (
        "criterion",
        "optimizer",
        "lr_scheduler",
        "scoring",
        "bpe",
        "tokenizer",
    )
    return {"_name": None, "task": task, "model": namespace, **{k: None for k in unused}}
