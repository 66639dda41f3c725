"""The LightConv / DynamicConv family's side of fairseq's checkpoints
(fairseq/models/lightconv.py): its arguments <-> LightConvConfig, and its state dict made
loadable.

Reading applies fairseq's defaults as its architecture functions do: an argument the checkpoint
gives wins, then the named preset's value (`convseq.models.lightconv_config.PRESETS`), then
``base_architecture``'s (the config's defaults, derived ones filled in by
`LightConvConfig.resolved`). Writing gives every argument explicitly, so no preset value is
applied over it.

Sinusoidal positions have no state-dict entry in fairseq 0.12; releases before it kept a
``embed_positions._float_tensor`` (and earlier a ``weights`` table) buffer, which fairseq drops
on loading and so does convseq. Files written before fairseq had ``decoder.output_projection``
hold the untied output matrix as ``decoder.embed_out`` and no entry for a tied one; both are
brought to the current names. convseq writes what fairseq 0.12 writes.
"""

from __future__ import annotations

import ast
import dataclasses
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from convseq.checkpoints.fairseq_args import (
    FAIRSEQ_PAD,
    FairseqAdapter,
    arch_of,
    as_bool,
    as_number,
    get_arg,
    max_positions,
    model_args,
)
from convseq.errors import CheckpointError
from convseq.models.lightconv_config import PRESETS, LightConvConfig

# fairseq's registered LightConv translation architectures, each with its overrides of the base
# values: the base itself (none) and its presets
ARCH_OVERRIDES: dict[str, dict[str, object]] = {"lightconv": {}, **PRESETS}
ARCHS: tuple[str, ...] = tuple(ARCH_OVERRIDES)
_NOT_ARGS = ("arch", "family", "max_source_positions", "max_target_positions")
_SIDES = ("encoder", "decoder")


def _int_list(value: Any, key: str) -> tuple[int, ...]:
    """A kernel-size list as fairseq stores it: a list of ints, or its string ("[3, 7]")."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise CheckpointError(f"{key}: expected a list of integers, got {value!r}") from None
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items or not all(isinstance(x, int) and not isinstance(x, bool) for x in items):
        raise CheckpointError(f"{key}: expected a list of integers, got {value!r}")
    return tuple(items)


def _typed(value: Any, annotation: str, key: str) -> Any:
    """``value`` read as the LightConvConfig field of that annotation wants it."""
    kind = annotation.split("|")[0].strip()
    if kind.startswith("tuple"):
        return _int_list(value, key)
    if kind == "bool":
        return as_bool(value, key)
    if kind in ("int", "float"):
        return as_number(value, int if kind == "int" else float, key)
    if not isinstance(value, str):
        raise CheckpointError(f"{key}: expected a string, got {value!r}")
    return value


def lightconv_config(state: Mapping[str, Any]) -> LightConvConfig:
    """The resolved LightConvConfig of a fairseq LightConv checkpoint (arguments the checkpoint
    leaves out take fairseq's defaults for its architecture; maximum positions as
    `convseq.checkpoints.fairseq_args.max_positions` reads them)."""
    args, where = model_args(state)
    arch = arch_of(state)
    if arch not in ARCHS:
        raise CheckpointError(
            f"architecture {arch!r} is not one of fairseq's LightConv architectures "
            f"({', '.join(ARCHS)})"
        )
    label = f"{where}."
    given = {}
    for field in dataclasses.fields(LightConvConfig):
        value = None if field.name in _NOT_ARGS else get_arg(args, field.name)
        if value is not None:  # None: left to the preset or to fairseq's derivation
            given[field.name] = _typed(value, str(field.type), label + field.name)
    values: dict[str, Any] = {**ARCH_OVERRIDES[arch], **given}
    for side in ("source", "target"):
        values[f"max_{side}_positions"] = max_positions(state, side, label)
    try:
        return LightConvConfig(arch=arch, **values).resolved()
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None


def checkpoint_config(
    state: Mapping[str, Any], model_sd: Mapping[str, torch.Tensor]
) -> LightConvConfig:
    """`lightconv_config`, the maximum positions of learned tables from their rows (fairseq
    gives such a table max + pad + 1 rows)."""
    cfg = lightconv_config(state)
    for side, key in (("source", "encoder"), ("target", "decoder")):
        table = model_sd.get(f"{key}.embed_positions.weight")
        if table is not None and getattr(cfg, f"{key}_learned_pos"):
            setattr(cfg, f"max_{side}_positions", int(table.shape[0]) - FAIRSEQ_PAD - 1)
    return cfg


def fairseq_model_args(cfg: LightConvConfig) -> dict[str, Any]:
    """Every LightConv argument fairseq's ``build_model`` reads, as its parser stores them."""
    cfg = cfg.resolved()
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    args: dict[str, Any] = {"arch": LIGHTCONV.arch_to_write(cfg.arch)}
    for key, value in values.items():
        if key in ("arch", "family"):
            continue
        args[key] = list(value) if isinstance(value, tuple) else value
    args["encoder_embed_path"] = args["decoder_embed_path"] = None
    return args


def upgrade_state_dict(
    state_dict: Mapping[str, torch.Tensor], cfg: LightConvConfig, path: Path
) -> OrderedDict[str, torch.Tensor]:
    """A copy of a fairseq LightConv state dict in fairseq 0.12's layout (see the module's
    docstring): sinusoidal positions' buffers dropped, ``decoder.embed_out`` renamed.

    Raises:
        CheckpointError: the file holds both ``decoder.embed_out`` and
            ``decoder.output_projection.weight``.
    """
    out: OrderedDict[str, torch.Tensor] = OrderedDict(state_dict)
    for side in _SIDES:
        if cfg.no_token_positional_embeddings or getattr(cfg, f"{side}_learned_pos"):
            continue  # a stray entry then stays, and the strict load names it
        for name in ("_float_tensor", "weights"):
            out.pop(f"{side}.embed_positions.{name}", None)
    projection = "decoder.output_projection.weight"
    if "decoder.embed_out" in out:
        if projection in out:
            raise CheckpointError(f"{path}: both decoder.embed_out and {projection}")
        out[projection] = out.pop("decoder.embed_out")
    elif projection not in out and cfg.share_decoder_input_output_embed:
        if "decoder.embed_tokens.weight" in out:
            out[projection] = out["decoder.embed_tokens.weight"]
    return out


LIGHTCONV = FairseqAdapter(
    family="lightconv",
    archs=ARCHS,
    base_arch="lightconv",
    config=checkpoint_config,
    model_args=fairseq_model_args,
    upgrade=upgrade_state_dict,
    joined_dictionary=lambda cfg: bool(cfg.share_all_embeddings),
)
