"""fairseq's fconv arguments <-> FConvConfig, and the language pair a checkpoint was trained on.

fairseq stores a model's arguments as an ``argparse.Namespace``: ``state["args"]`` in files
written before fairseq 0.10, ``state["cfg"]["model"]`` (with ``_name`` = the arch) after it.
Layer specifications are Python-expression strings such as ``"[(512, 3)] * 20"``; convseq reads
them with its safe spec parser, never ``eval``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import Any

from convseq.errors import CheckpointError
from convseq.models.config import FConvConfig
from convseq.models.spec import SpecError, parse_attention, parse_layers

# fairseq's base_architecture (fairseq/models/fconv.py): what any fconv arch leaves unset
BASE_ARCH: dict[str, Any] = {
    "dropout": 0.1,
    "encoder_embed_dim": 512,
    "encoder_layers": "[(512, 3)] * 20",
    "decoder_embed_dim": 512,
    "decoder_layers": "[(512, 3)] * 20",
    "decoder_out_embed_dim": 256,
    "decoder_attention": "True",
    "share_input_output_embed": False,
}

_EN_DE = "[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2"
_EN_FR = "[(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3 + [(2048, 1)] * 1 + [(4096, 1)] * 1"

# fairseq's named fconv architectures: the values each sets before falling back to the base
ARCH_OVERRIDES: dict[str, dict[str, Any]] = {
    "fconv": {},
    "fconv_iwslt_de_en": {
        "encoder_embed_dim": 256,
        "encoder_layers": "[(256, 3)] * 4",
        "decoder_embed_dim": 256,
        "decoder_layers": "[(256, 3)] * 3",
        "decoder_out_embed_dim": 256,
    },
    "fconv_wmt_en_ro": {"decoder_out_embed_dim": 512},
    "fconv_wmt_en_de": {
        "encoder_embed_dim": 768,
        "encoder_layers": _EN_DE,
        "decoder_embed_dim": 768,
        "decoder_layers": _EN_DE,
        "decoder_out_embed_dim": 512,
    },
    "fconv_wmt_en_fr": {
        "encoder_embed_dim": 768,
        "encoder_layers": _EN_FR,
        "decoder_embed_dim": 768,
        "decoder_layers": _EN_FR,
        "decoder_out_embed_dim": 512,
    },
}

DEFAULT_MAX_POSITIONS = 1024  # fairseq's translation task default for both sides


def arch_defaults(arch: str) -> dict[str, Any]:
    """fairseq's values for every fconv argument of the named architecture."""
    if arch not in ARCH_OVERRIDES:
        raise CheckpointError(
            f"architecture {arch!r} is not one of fairseq's translation fconv architectures "
            f"({', '.join(ARCH_OVERRIDES)}); convseq loads only those (not fconv_lm or "
            "fconv_self_att)"
        )
    return {**BASE_ARCH, **ARCH_OVERRIDES[arch]}


def _get(obj: Any, key: str) -> Any:
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


def _as_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise CheckpointError(f"{key}: expected a boolean, got {value!r}")


def _as_number(value: Any, kind: type, key: str) -> Any:
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise CheckpointError(f"{key}: expected {kind.__name__}, got {value!r}") from None


def fconv_config(state: Mapping[str, Any]) -> FConvConfig:
    """The FConvConfig of a fairseq fconv checkpoint.

    Arguments the checkpoint leaves out take fairseq's defaults for its architecture; the
    maximum positions come from the model arguments, then the task's, then fairseq's 1024 (the
    caller may still correct them from the positional tables' shapes).
    """
    args, where = model_args(state)
    arch = _get(args, "arch") or _get(args, "_name")
    if not isinstance(arch, str):
        raise CheckpointError(f"{where}: no 'arch' (or '_name') naming the fconv architecture")
    values = arch_defaults(arch)
    for key in values:
        given = _get(args, key)
        if given is not None:
            values[key] = given
    label = f"{where}."
    fields: dict[str, Any] = {
        "arch": arch,
        "dropout": _as_number(values["dropout"], float, label + "dropout"),
        "encoder_embed_dim": _as_number(
            values["encoder_embed_dim"], int, label + "encoder_embed_dim"
        ),
        "decoder_embed_dim": _as_number(
            values["decoder_embed_dim"], int, label + "decoder_embed_dim"
        ),
        "decoder_out_embed_dim": _as_number(
            values["decoder_out_embed_dim"], int, label + "decoder_out_embed_dim"
        ),
        "share_input_output_embed": _as_bool(
            values["share_input_output_embed"], label + "share_input_output_embed"
        ),
    }
    try:  # read (and so check) the expressions here, to name the checkpoint in the error
        fields["encoder_layers"] = [
            list(x) for x in parse_layers(values["encoder_layers"], "encoder_layers")
        ]
        fields["decoder_layers"] = [
            list(x) for x in parse_layers(values["decoder_layers"], "decoder_layers")
        ]
        flags = parse_attention(values["decoder_attention"], len(fields["decoder_layers"]))
        fields["decoder_attention"] = flags[0] if len(set(flags)) == 1 else list(flags)
    except SpecError as e:
        raise CheckpointError(f"{where}: {e}") from None
    task = state.get("cfg", {}).get("task") if isinstance(state.get("cfg"), Mapping) else None
    for side in ("source", "target"):
        key = f"max_{side}_positions"
        value = _get(args, key)
        if value is None:
            value = _get(task, key)
        if value is None:  # checkpoints from before 2018 had one --max-positions for both
            value = _get(args, "max_positions")
        fields[key] = _as_number(
            DEFAULT_MAX_POSITIONS if value is None else value, int, label + key
        )
    return FConvConfig(**fields)


def language_pair(state: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(source, target) language codes from ``args``, ``cfg.task`` or ``cfg.model``."""
    places = [state.get("args")]
    theirs = state.get("cfg")  # fairseq's own config
    if isinstance(theirs, Mapping):
        places += [theirs.get("task"), theirs.get("model")]
    src = tgt = None
    for place in places:
        src = src or _get(place, "source_lang")
        tgt = tgt or _get(place, "target_lang")
    return src, tgt


# -- the other direction: FConvConfig -> fairseq's arguments ------------------------------------


def layers_expression(value: Any, key: str) -> str:
    """fairseq's string form of a layer specification, runs written as ``[(C, k)] * n``."""
    layers = parse_layers(value, key)
    parts = []
    for (channels, kernel, residual), run in groupby(layers):
        item = f"({channels}, {kernel})" if residual == 1 else f"({channels}, {kernel}, {residual})"
        parts.append(f"[{item}] * {len(list(run))}")
    return " + ".join(parts)


def attention_expression(value: Any, num_layers: int) -> str:
    """fairseq's string form of the decoder attention: "True", "False" or "[True, False, ...]"."""
    flags = parse_attention(value, num_layers)
    if len(set(flags)) == 1:
        return str(flags[0])
    return "[" + ", ".join(str(f) for f in flags) + "]"


def fairseq_model_args(cfg: FConvConfig) -> dict[str, Any]:
    """The fconv arguments fairseq's ``build_model`` reads, as fairseq's parser stores them."""
    decoder_layers = layers_expression(cfg.decoder_layers, "decoder_layers")
    num_decoder_layers = len(parse_layers(cfg.decoder_layers, "decoder_layers"))
    # convseq's own presets (e.g. fconv_toy) are not registered in fairseq: name the base arch,
    # whose defaults every explicit argument below overrides anyway
    arch = cfg.arch if cfg.arch in ARCH_OVERRIDES else "fconv"
    return {
        "arch": arch,
        "dropout": float(cfg.dropout),
        "encoder_embed_dim": int(cfg.encoder_embed_dim),
        "encoder_embed_path": None,
        "encoder_layers": layers_expression(cfg.encoder_layers, "encoder_layers"),
        "decoder_embed_dim": int(cfg.decoder_embed_dim),
        "decoder_embed_path": None,
        "decoder_layers": decoder_layers,
        "decoder_out_embed_dim": int(cfg.decoder_out_embed_dim),
        "decoder_attention": attention_expression(cfg.decoder_attention, num_decoder_layers),
        "share_input_output_embed": bool(cfg.share_input_output_embed),
        "max_source_positions": int(cfg.max_source_positions),
        "max_target_positions": int(cfg.max_target_positions),
    }


def fairseq_args(cfg: FConvConfig, src_lang: str, tgt_lang: str, data: str) -> argparse.Namespace:
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
        **fairseq_model_args(cfg),
    )


def fairseq_cfg(cfg: FConvConfig, src_lang: str, tgt_lang: str, data: str) -> dict[str, Any]:
    """A ``cfg`` as fairseq >= 0.10.2 saves it (a plain container), for an argparse model.

    ``model`` is the flat Namespace with ``_name`` = the arch, as fairseq's
    ``convert_namespace_to_omegaconf`` makes it for models without a dataclass; ``task`` holds
    fields of fairseq's TranslationConfig only (fairseq merges it into that dataclass).
    """
    model = fairseq_args(cfg, src_lang, tgt_lang, data)
    model._name = model.arch
    task = {
        "_name": "translation",
        "data": data,
        "source_lang": src_lang,
        "target_lang": tgt_lang,
        "left_pad_source": True,
        "left_pad_target": False,
        "max_source_positions": int(cfg.max_source_positions),
        "max_target_positions": int(cfg.max_target_positions),
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
    return {"_name": None, "task": task, "model": model, **{k: None for k in unused}}
