"""What a search calls and what it returns: the `SearchModel` protocol, its adapter over any
model with fairseq's incremental-decoder interface, and the `Hypothesis` a search finishes with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypedDict, runtime_checkable

import torch
from torch import nn

from convseq.common.specials import EOS_ID, PAD_ID, UNK_ID


class Hypothesis(TypedDict):
    """One finished translation, as fairseq's SequenceGenerator returns it."""

    tokens: torch.Tensor  # (L,) long, the output tokens ending in EOS (no leading EOS)
    score: float  # sum of log-probs, divided by L ** lenpen when scores are normalised
    positional_scores: torch.Tensor  # (L,) fp32, the log-prob of each token
    attention: torch.Tensor | None  # (src_len, L) layer-averaged attention, padding removed


@runtime_checkable
class SearchModel(Protocol):
    """What a search calls. An ensemble implements it by combining several models per step.

    ``decode`` returns fp32 log-probabilities of the next token for every row, which the search
    may modify in place, and the attention of that step (or None).
    """

    pad: int
    eos: int
    unk: int

    def encode(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor) -> Any: ...

    def decode(
        self, prev_tokens: torch.Tensor, encoder_out: Any, incremental_state: dict | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def reorder_encoder_out(self, encoder_out: Any, new_order: torch.Tensor) -> Any: ...

    def reorder_incremental_state(
        self, incremental_state: dict, new_order: torch.Tensor
    ) -> None: ...

    def max_target_positions(self) -> int | None: ...

    def generation_context(
        self, beam_size: int | None, fold_weight_norm: bool, need_attn: bool
    ) -> AbstractContextManager: ...


class IncrementalDecoderModel:
    """A `SearchModel` over any model with fairseq's incremental-decoder interface.

    The model needs ``encoder(src_tokens, src_lengths)``, ``decoder(prev_output_tokens,
    encoder_out=..., incremental_state=...)`` returning ``(logits, attention)``,
    ``reorder_encoder_out`` and ``reorder_incremental_state`` (on the model or on its encoder /
    decoder), and optionally ``get_normalized_probs``, ``max_positions`` and
    ``generation_mode`` (convseq's FConvModel and LightConvModel have them all).
    """

    def __init__(self, model: nn.Module):
        self.model = model
        decoder = model.decoder
        self.pad = int(getattr(decoder, "padding_idx", PAD_ID))
        self.eos = EOS_ID
        self.unk = UNK_ID
        normalizer = getattr(model, "get_normalized_probs", None) or getattr(
            decoder, "get_normalized_probs", None
        )
        self._normalize = normalizer

    def encode(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor) -> Any:
        return self.model.encoder(src_tokens, src_lengths)

    def decode(
        self, prev_tokens: torch.Tensor, encoder_out: Any, incremental_state: dict | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, V) fp32 log-probs of the token after ``prev_tokens`` and the (B, S) attention.

        With ``incremental_state=None`` the decoder runs over the whole prefix (full forward).
        """
        logits, attn = self.model.decoder(
            prev_tokens, encoder_out=encoder_out, incremental_state=incremental_state
        )
        logits = logits[:, -1:, :]  # (B, 1, V): only the newest position is scored
        if self._normalize is not None:
            lprobs = self._normalize((logits, attn), log_probs=True)
        else:
            lprobs = torch.log_softmax(logits.float(), dim=-1)
        lprobs = lprobs[:, -1, :].float()  # (B, V)
        if attn is not None:
            attn = attn[:, -1, :]  # (B, S)
        return lprobs, attn

    def reorder_encoder_out(self, encoder_out: Any, new_order: torch.Tensor) -> Any:
        owner = self.model if hasattr(self.model, "reorder_encoder_out") else self.model.encoder
        return owner.reorder_encoder_out(encoder_out, new_order)

    def reorder_incremental_state(self, incremental_state: dict, new_order: torch.Tensor) -> None:
        owner = (
            self.model if hasattr(self.model, "reorder_incremental_state") else self.model.decoder
        )
        owner.reorder_incremental_state(incremental_state, new_order)

    def max_target_positions(self) -> int | None:
        """The longest decoder input the model can number, or None if unlimited."""
        limits = getattr(self.model, "max_positions", None)
        if limits is None:
            return None
        limits = limits()
        if isinstance(limits, Sequence):
            limits = limits[1]
        return None if limits is None else int(limits)

    def generation_context(
        self, beam_size: int | None, fold_weight_norm: bool, need_attn: bool
    ) -> AbstractContextManager:
        """The model's own generation mode when it has one, else eval mode; both restored after."""
        mode = getattr(self.model, "generation_mode", None)
        if mode is not None:
            return mode(beam_size=beam_size, fold_weight_norm=fold_weight_norm, need_attn=need_attn)
        return _eval_mode(self.model, need_attn)


@contextlib.contextmanager
def _eval_mode(model: nn.Module, need_attn: bool) -> Iterator[None]:
    modes = [(m, m.training) for m in model.modules()]
    decoder = getattr(model, "decoder", None)
    old_need_attn = getattr(decoder, "need_attn", None)
    try:
        model.eval()
        if old_need_attn is not None:
            decoder.need_attn = need_attn
        yield
    finally:
        for m, training in modes:
            m.training = training
        if old_need_attn is not None:
            decoder.need_attn = old_need_attn


def as_search_model(model: Any) -> SearchModel:
    """``model`` itself if it already implements `SearchModel`, else an adapter around it."""
    if isinstance(model, SearchModel):
        return model
    if not (hasattr(model, "encoder") and hasattr(model, "decoder")):
        raise TypeError(
            f"{type(model).__name__} is not a search model: it needs an encoder and an "
            "incremental decoder (fairseq's interface) or the SearchModel methods"
        )
    return IncrementalDecoderModel(model)
