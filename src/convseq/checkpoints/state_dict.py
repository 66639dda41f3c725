"""A fairseq fconv state dict made loadable: the pre-2018 decoder weight norm, vocabulary checks.

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
from pathlib import Path

import torch

from convseq.errors import CheckpointError

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


def check_vocabularies(
    state_dict: Mapping[str, torch.Tensor],
    src_size: int,
    tgt_size: int,
    src_path: Path,
    tgt_path: Path,
    checkpoint: Path,
) -> None:
    """Check the dictionaries' sizes against the embedding tables, with a clear error.

    fairseq pads every vocabulary to a multiple of 8 with ``madeupwordNNNN`` symbols, so only
    the dict.txt files shipped with the model give the right sizes.
    """
    rows = {}
    for side, key in (
        ("source", "encoder.embed_tokens.weight"),
        ("target", "decoder.embed_tokens.weight"),
    ):
        if key not in state_dict:
            raise CheckpointError(f"{checkpoint}: the model state has no {key}")
        rows[side] = int(state_dict[key].shape[0])
    if rows["source"] == src_size and rows["target"] == tgt_size:
        return
    problems = []
    for side, size, path, key in (
        ("source", src_size, src_path, "encoder"),
        ("target", tgt_size, tgt_path, "decoder"),
    ):
        if rows[side] != size:
            problems.append(
                f"{path} gives {size} symbols (4 specials + its lines) but the checkpoint's "
                f"{key}.embed_tokens.weight has {rows[side]} rows"
            )
    hint = ""
    if rows["source"] == tgt_size and rows["target"] == src_size:
        hint = " The sizes fit with source and target swapped: check the language pair."
    raise CheckpointError(
        f"{checkpoint}: dictionary size mismatch: {'; '.join(problems)}. Use the dict.*.txt "
        "files shipped with the model (fairseq pads vocabularies to a multiple of 8 with "
        "madeupwordNNNN symbols; a dictionary rebuilt from data will not match)." + hint
    )


def describe_load_error(
    missing: list[str], unexpected: list[str], mismatched: list[str], arch: str
) -> str:
    """A readable account of why a state dict does not fit the model built from its args."""
    parts = []
    if missing:
        parts.append(f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        parts.append(f"unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
    if mismatched:
        parts.append(f"shape mismatch {mismatched[:8]}{' ...' if len(mismatched) > 8 else ''}")
    return (
        f"the model state does not fit an {arch} model built from the checkpoint's arguments: "
        + "; ".join(parts)
    )
