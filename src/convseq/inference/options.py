"""Search settings (`GenOptions`, the ``gen`` config group's search keys) and generation errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from convseq.errors import ConvseqError

DEFAULT_MAX_TOKENS = 4000  # source tokens per batch when translating raw text


class GenerationError(ConvseqError):
    """Search settings that cannot be honoured (e.g. min_len above a sentence's max length)."""


class GenerationOOM(ConvseqError):
    """The device ran out of memory on a generation batch; the message says what to lower."""


@dataclass
class GenOptions:
    """Search settings (the search keys of the `gen` config group; fairseq-generate's flags)."""

    beam: int = 5
    lenpen: float = 1.0
    unk_penalty: float = 0.0
    min_len: int = 1
    max_len_a: float = 0.0
    max_len_b: int = 200
    nbest: int = 1
    normalize_scores: bool = True  # False: fairseq's --unnormalized
    need_attn: bool = True  # attention and alignments in the output (off: a little faster)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None, **overrides: Any) -> GenOptions:
        """The options among ``values`` (other keys, e.g. ``max_tokens``, are ignored)."""
        names = {f.name for f in fields(cls)}
        merged = {k: v for k, v in dict(values or {}).items() if k in names}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"unknown generation option(s) {unknown}; valid: {sorted(names)}")
        merged.update(overrides)
        return cls(**merged)

    def search_kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def is_oom(error: BaseException) -> bool:
    """Whether an exception is the device (or host) running out of memory."""
    oom_type = getattr(torch, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(error, oom_type):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def out_of_memory(src_tokens: torch.Tensor) -> GenerationOOM:
    """The error for an out-of-memory batch, saying what to lower."""
    if src_tokens.is_cuda:
        torch.cuda.empty_cache()
    bsz, width = src_tokens.shape
    return GenerationOOM(
        f"out of memory while translating a batch of {bsz} sentences ({bsz} x {width} = "
        f"{bsz * width} source tokens, padding included): lower gen.max_tokens (or set "
        "gen.batch_size, or a smaller gen.beam) and run again"
    )
