"""An ensemble of translation models, searched as one: probabilities averaged at every step.

`EnsembleModel` implements `convseq.search.SearchModel`, so every search takes it where it takes
a single model. At each step every member scores the same hypotheses and the ensemble returns
``log(mean_i p_i)`` (``logsumexp`` of the members' log-probabilities minus ``log n``), as
fairseq's EnsembleModel does; the attention is the members' mean.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from convseq.search import SearchModel, as_search_model


class EnsembleModel:
    """Several models with the same dictionaries, searched together.

    Args:
        models: FConvModels, LightConvModels (the families may be mixed), fairseq-style
            incremental-decoder models or `SearchModel`s; all must share the target dictionary
            (the same ids for the same symbols).
    """

    def __init__(self, models: Sequence[Any]):
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.members: list[SearchModel] = [as_search_model(m) for m in models]
        first = self.members[0]
        for i, m in enumerate(self.members[1:], start=1):
            if (m.pad, m.eos, m.unk) != (first.pad, first.eos, first.unk):
                raise ValueError(
                    f"model {i} numbers pad/eos/unk as {(m.pad, m.eos, m.unk)}, model 0 as "
                    f"{(first.pad, first.eos, first.unk)}: ensemble members must share dictionaries"
                )
        self.pad, self.eos, self.unk = first.pad, first.eos, first.unk
        self._log_n = math.log(len(self.members))

    def __len__(self) -> int:
        return len(self.members)

    def encode(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor) -> list[Any]:
        return [m.encode(src_tokens, src_lengths) for m in self.members]

    def decode(
        self, prev_tokens: torch.Tensor, encoder_out: list[Any], incremental_state: dict | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(rows, V) log of the members' mean probability, and their mean attention (or None)."""
        if len(self.members) == 1:
            return self.members[0].decode(prev_tokens, encoder_out[0], _own(incremental_state, 0))
        lprobs, attns = [], []
        for i, (m, enc) in enumerate(zip(self.members, encoder_out)):
            lp, attn = m.decode(prev_tokens, enc, _own(incremental_state, i))
            lprobs.append(lp)
            attns.append(attn)
        stacked = torch.stack(lprobs)  # (n, rows, V)
        avg = torch.logsumexp(stacked, dim=0) - self._log_n  # (rows, V)
        attn = None
        if all(a is not None for a in attns):
            attn = torch.stack(attns).mean(dim=0)  # (rows, S)
        return avg, attn

    def reorder_encoder_out(self, encoder_out: list[Any], new_order: torch.Tensor) -> list[Any]:
        return [
            m.reorder_encoder_out(enc, new_order)
            for m, enc in zip(self.members, encoder_out, strict=True)
        ]

    def reorder_incremental_state(self, incremental_state: dict, new_order: torch.Tensor) -> None:
        for i, m in enumerate(self.members):
            m.reorder_incremental_state(_own(incremental_state, i), new_order)

    def max_target_positions(self) -> int | None:
        limits = [p for p in (m.max_target_positions() for m in self.members) if p is not None]
        return min(limits) if limits else None

    def generation_context(
        self, beam_size: int | None, fold_weight_norm: bool, need_attn: bool
    ) -> AbstractContextManager:
        """Every member's generation context, entered when this one is (not before)."""
        return _all_members(self.members, beam_size, fold_weight_norm, need_attn)


@contextlib.contextmanager
def _all_members(
    members: Sequence[SearchModel], beam_size: int | None, fold_weight_norm: bool, need_attn: bool
) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for m in members:
            stack.enter_context(m.generation_context(beam_size, fold_weight_norm, need_attn))
        yield


def _own(incremental_state: dict | None, i: int) -> dict | None:
    """Member ``i``'s own incremental state inside the search's dict.

    Separate dicts keep the members apart even when the same module object is listed twice (its
    modules key their buffers by their own ids, which would then collide).
    """
    if incremental_state is None:
        return None
    return incremental_state.setdefault(("ensemble", i), {})
