"""The fconv family's side of fairseq's checkpoints (fairseq/models/fconv.py): its arguments
<-> FConvConfig, and its state dict made loadable (the pre-2018 decoder weight norm).

Layer specifications are Python-expression strings such as ``"[(512, 3)] * 20"``; convseq reads
them with its safe spec parser, never ``eval``.

Until fairseq's commit 9f3ccaa6 (Dec 2017) the decoder convolutions were weight-normed over
dim 0 of their (k, in, out) time-major weight, one norm per kernel tap, so ``weight_g`` is
(k, 1, 1). Such files have no ``decoder.version`` buffer (or one below 2); current fairseq no
longer converts them. convseq folds g * v / ||v|| into the plain weight W and splits W again
in the modern form (g = ||W|| over dims 0-1, one norm per output channel; v = W), which computes
the same convolution, so the model loads strictly.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from itertools import groupby
from pathlib import Path
from typing import Any

import torch

from convseq.checkpoints.fairseq_args import (
    FairseqAdapter,
    arch_of,
    as_bool,
    as_number,
    get_arg,
    max_positions,
    model_args,
)
from convseq.errors import CheckpointError
from convseq.models.config import FConvConfig, as_fconv_config
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


def arch_defaults(arch: str) -> dict[str, Any]:
    """fairseq's values for every fconv argument of the named architecture."""
    if arch not in ARCH_OVERRIDES:
        raise CheckpointError(
            f"architecture {arch!r} is not one of fairseq's translation fconv architectures "
            f"({', '.join(ARCH_OVERRIDES)}); convseq loads only those (not fconv_lm or "
            "fconv_self_att)"
        )
    return {**BASE_ARCH, **ARCH_OVERRIDES[arch]}


def fconv_config(state: Mapping[str, Any]) -> FConvConfig:
    """The FConvConfig of a fairseq fconv checkpoint.

    Arguments the checkpoint leaves out take fairseq's defaults for its architecture; the
    maximum positions come from the model arguments, then the task's, then fairseq's 1024 (the
    positional tables' shapes may still correct them: `checkpoint_config`).
    """
    args, where = model_args(state)
    arch = arch_of(state)
    values = arch_defaults(arch)
    for key in values:
        given = get_arg(args, key)
        if given is not None:
            values[key] = given
    label = f"{where}."
    fields: dict[str, Any] = {
        "arch": arch,
        "dropout": as_number(values["dropout"], float, label + "dropout"),
    }
    for key in ("encoder_embed_dim", "decoder_embed_dim", "decoder_out_embed_dim"):
        fields[key] = as_number(values[key], int, label + key)
    fields["share_input_output_embed"] = as_bool(
        values["share_input_output_embed"], label + "share_input_output_embed"
    )
    try:  # read (and so check) the expressions here, to name the checkpoint in the error
        for key in ("encoder_layers", "decoder_layers"):
            fields[key] = [list(x) for x in parse_layers(values[key], key)]
        flags = parse_attention(values["decoder_attention"], len(fields["decoder_layers"]))
        fields["decoder_attention"] = flags[0] if len(set(flags)) == 1 else list(flags)
    except SpecError as e:
        raise CheckpointError(f"{where}: {e}") from None
    for side in ("source", "target"):
        fields[f"max_{side}_positions"] = max_positions(state, side, label)
    return FConvConfig(**fields)


def checkpoint_config(
    state: Mapping[str, Any], model_sd: Mapping[str, torch.Tensor]
) -> FConvConfig:
    """`fconv_config`, its maximum positions from the positional tables' rows (fairseq sizes
    them from max_*_positions: the tables are the truth)."""
    cfg = fconv_config(state)
    for side, key in (("source", "encoder"), ("target", "decoder")):
        table = model_sd.get(f"{key}.embed_positions.weight")
        if table is not None:
            setattr(cfg, f"max_{side}_positions", int(table.shape[0]))
    return cfg


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
    cfg = as_fconv_config(cfg)
    decoder_layers = layers_expression(cfg.decoder_layers, "decoder_layers")
    num_decoder_layers = len(parse_layers(cfg.decoder_layers, "decoder_layers"))
    return {
        # convseq's own presets (e.g. fconv_toy) are not registered in fairseq: the base arch,
        # whose defaults every explicit argument below overrides anyway
        "arch": FCONV.arch_to_write(cfg.arch),
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


# -- the state dict: the pre-2018 decoder weight norm -------------------------------------------

_DECODER_CONV_G = re.compile(r"^decoder\.convolutions\.(\d+)\.weight_g$")


def decoder_version(state_dict: Mapping[str, torch.Tensor]) -> float:
    """The ``decoder.version`` buffer's value; 1 when absent (files from 2017)."""
    version = state_dict.get("decoder.version")
    if version is None:
        return 1.0
    return float(torch.as_tensor(version).reshape(-1)[0])


def _fold_tap_norm(g: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tap weight norm (dim 0) -> per-output-channel weight norm (dim 2) of a TBC weight.

    Args:
        g: (k, 1, 1) gains, one per kernel tap.
        v: (k, in, out) directions.

    Returns:
        g' (1, 1, out) and v' (k, in, out) with g' * v' / ||v'|| = g * v / ||v||.
    """
    dtype = v.dtype if v.dtype in (torch.float32, torch.float64) else torch.float32
    v64 = v.to(torch.float64)
    tap_norm = v64.pow(2).sum(dim=(1, 2), keepdim=True).sqrt()  # (k, 1, 1)
    # a zero tap stays zero instead of 0/0 (torch's own weight norm would give nan)
    weight = g.to(torch.float64) * v64 / tap_norm.clamp_min(torch.finfo(torch.float64).tiny)
    channel_norm = weight.pow(2).sum(dim=(0, 1), keepdim=True).sqrt()  # (1, 1, out)
    return channel_norm.to(dtype), weight.to(dtype)


def upgrade_state_dict(
    state_dict: Mapping[str, torch.Tensor], path: str | Path
) -> OrderedDict[str, torch.Tensor]:
    """A copy of a fairseq fconv state dict in the current layout (``decoder.version`` = 2).

    Every decoder convolution whose ``weight_g`` is (k, 1, 1) -- the pre-2018 per-tap form --
    is folded into the per-channel form; one already in the (1, 1, 2C) form is kept.

    Raises:
        CheckpointError: a decoder convolution's gain has neither shape, or the file says
            version >= 2 but holds per-tap gains.
    """
    out: OrderedDict[str, torch.Tensor] = OrderedDict(state_dict)
    version = decoder_version(state_dict)
    for key in list(out):
        match = _DECODER_CONV_G.match(key)
        if match is None:
            continue
        v_key = f"decoder.convolutions.{match.group(1)}.weight_v"
        g, v = out[key], out.get(v_key)
        if v is None or v.dim() != 3:
            raise CheckpointError(f"{path}: {key} has no 3-d {v_key} beside it")
        k, _, channels = v.shape
        if tuple(g.shape) == (1, 1, channels):
            continue  # already the per-output-channel form
        if tuple(g.shape) != (k, 1, 1):
            raise CheckpointError(
                f"{path}: {key} has shape {tuple(g.shape)}; expected (1, 1, {channels}) or, "
                f"in files from before 2018, ({k}, 1, 1)"
            )
        if version >= 2:
            raise CheckpointError(
                f"{path}: decoder.version is {version:g} but {key} has the pre-2018 per-tap "
                f"shape ({k}, 1, 1); the file is inconsistent"
            )
        out[key], out[v_key] = _fold_tap_norm(g, v)
    out["decoder.version"] = torch.tensor([2.0])
    return out


FCONV = FairseqAdapter(
    family="fconv",
    archs=tuple(ARCH_OVERRIDES),
    base_arch="fconv",
    config=checkpoint_config,
    model_args=fairseq_model_args,
    upgrade=lambda state_dict, cfg, path: upgrade_state_dict(state_dict, path),
    joined_dictionary=lambda cfg: False,
)
