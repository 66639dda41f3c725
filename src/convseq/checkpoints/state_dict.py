"""Checks of a fairseq model state against what it is loaded with, for every family: the
dictionaries' sizes against the embedding tables, and a readable account of keys that do not fit.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from convseq.errors import CheckpointError


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
        f"the model state does not fit the {arch} model built from the checkpoint's arguments: "
        + "; ".join(parts)
    )
