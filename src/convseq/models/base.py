"""`EncoderDecoderModel`: what every family's model delegates to its encoder and decoder alike,
and `eval_mode`, what every family's ``generation_mode`` does alike.

A family's model (`FConvModel`, `LightConvModel`) holds an ``encoder`` with
``reorder_encoder_out`` and ``max_positions`` and an incremental ``decoder`` with
``reorder_incremental_state``, ``get_normalized_probs`` and ``max_positions``; the search calls
these on the model (`convseq.search.interface`). Its own ``build``, ``forward`` and
``generation_mode`` stay in the family's file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from convseq.modules.linearized_conv import IncrementalState


class EncoderDecoderModel(nn.Module):
    """An encoder and an incremental decoder, with the model-level calls a search makes."""

    encoder: Any
    decoder: Any

    def get_normalized_probs(
        self, net_output: tuple[torch.Tensor, object] | torch.Tensor, log_probs: bool = True
    ) -> torch.Tensor:
        """(Log-)probabilities of the decoder's output, in fp32."""
        return self.decoder.get_normalized_probs(net_output, log_probs)

    def reorder_encoder_out(self, encoder_out: Any, new_order: torch.Tensor) -> Any:
        """The encoder output with row ``i`` taken from row ``new_order[i]`` (beam moves)."""
        return self.encoder.reorder_encoder_out(encoder_out, new_order)

    def reorder_incremental_state(
        self, incremental_state: IncrementalState, new_order: torch.Tensor
    ) -> None:
        """Row ``i`` of the decoder's caches continues row ``new_order[i]``."""
        self.decoder.reorder_incremental_state(incremental_state, new_order)

    def max_positions(self) -> tuple[int, int]:
        """(longest source, longest target) in tokens, EOS included."""
        return self.encoder.max_positions(), self.decoder.max_positions()


@contextlib.contextmanager
def eval_mode(model: nn.Module, need_attn: bool | None) -> Iterator[None]:
    """Every submodule in eval mode and, where `need_attn` is given and the model's decoder has
    the flag, ``decoder.need_attn`` set; each submodule's mode and the flag restored on exit."""
    modes = [(m, m.training) for m in model.modules()]
    decoder = getattr(model, "decoder", None)
    old_need_attn = getattr(decoder, "need_attn", None)
    try:
        model.eval()
        if need_attn is not None and old_need_attn is not None:
            decoder.need_attn = need_attn
        yield
    finally:
        for m, training in modes:
            m.training = training
        if old_need_attn is not None:
            decoder.need_attn = old_need_attn
