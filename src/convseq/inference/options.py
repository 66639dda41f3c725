"""Search settings: `GenOptions` (the ``gen`` group's search keys) and the default batch size."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

DEFAULT_MAX_TOKENS = 4000  # source tokens per batch when translating raw text


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
