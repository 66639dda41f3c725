"""The fconv encoder: embeddings, a stack of gated convolutions, and the (keys, values) pair."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from convseq.common.specials import PAD_ID
from convseq.models.spec import LayerSpec
from convseq.models.stack import conv_stack
from convseq.modules.grad_multiply import grad_multiply
from convseq.modules.layers import conv_tbc, linear

SQRT_HALF = math.sqrt(0.5)

# {"encoder_out": (x, y), "encoder_padding_mask": mask or None, "encoder_has_padding": flag or None}
EncoderOut = dict[str, object]


class FConvEncoder(nn.Module):
    """fairseq's FConvEncoder (left-padded source, time-major convolutions).

    Args:
        num_embeddings: source vocabulary size (the dictionary's length, padding included).
        embed_dim: token and position embedding size E.
        layers: one ``(channels, kernel, residual)`` per layer (`convseq.models.spec`).
        dropout: dropout probability (after the embeddings and before every convolution).
        max_positions: rows of the position table (usable length: rows - pad - 1).
        padding_idx: the pad symbol.
    """

    def __init__(
        self,
        num_embeddings: int,
        embed_dim: int,
        layers: Sequence[LayerSpec],
        dropout: float,
        max_positions: int = 1024,
        padding_idx: int = PAD_ID,
    ):
        super().__init__()
        self.dropout = dropout
        self.padding_idx = padding_idx
        self.layer_specs = tuple(layers)
        # set by FConvModel to the decoder's attention-layer count (for the gradient scaling)
        self.num_attention_layers: int | None = None

        def conv(in_channels: int, out_channels: int, kernel: int) -> nn.Module:
            # odd kernels pad symmetrically inside the conv; even ones are padded in forward
            padding = kernel // 2 if kernel % 2 == 1 else 0
            return conv_tbc(in_channels, out_channels * 2, kernel, dropout=dropout, padding=padding)

        stack = conv_stack(
            num_embeddings, embed_dim, max_positions, padding_idx, self.layer_specs, dropout, conv
        )
        self.embed_tokens, self.embed_positions = stack.embed_tokens, stack.embed_positions
        self.fc1 = stack.fc1
        self.projections, self.convolutions = stack.projections, stack.convolutions
        self.residuals = stack.residuals
        self.fc2 = linear(stack.out_channels, embed_dim)

    @property
    def grad_scale(self) -> float:
        """1 / (2 * attention layers): the factor on gradients reaching the encoder via x."""
        n = self.num_attention_layers
        # fairseq divides by zero here; with no attention the decoder ignores the encoder anyway
        return 1.0 / (2.0 * n) if n else 1.0

    def forward(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor | None) -> EncoderOut:
        """Encode a left-padded (B, S) source batch.

        Args:
            src_tokens: (B, S) token ids, padded on the left with ``padding_idx``.
            src_lengths: (B,) real lengths (unused, as in fairseq: the pads say it all).

        Returns:
            ``encoder_out``: (x, y), both (B, S, E): x the attention keys (gradient scaled),
            y = (x + input embedding) * sqrt(.5) the values; ``encoder_padding_mask``: (B, S)
            True at pads, or None when the batch has no padding (in training always the mask,
            and ``encoder_has_padding`` the () device flag of whether it holds a pad; None in
            eval).
        """
        x = self.embed_tokens(src_tokens) + self.embed_positions(src_tokens)  # (B, S, E)
        x = F.dropout(x, p=self.dropout, training=self.training)
        input_embedding = x  # zero at pads: both pad rows are zero
        x = self.fc1(x)  # (B, S, C0)

        mask = src_tokens.eq(self.padding_idx)  # (B, S)
        any_pad = None
        if self.training and not mask.is_meta:
            # No host read of mask.any() in training (on a GPU it waits for the device every
            # batch): the mask is applied whatever it holds (masked_fill of nothing is exact),
            # and the attention picks its scaling with the flag on the device.
            has_pad, any_pad = True, mask.any()  # () bool, on the device
        else:
            # on the meta device (shape inference without memory) assume padding: same shapes
            has_pad = True if mask.is_meta else bool(mask.any())
        mask_tb = mask.t().unsqueeze(-1) if has_pad else None  # (S, B, 1)

        x = x.transpose(0, 1)  # (S, B, C0): time-major for conv_tbc
        x = self._convolutions(x, mask_tb)  # (S, B, C)
        x = x.transpose(0, 1)  # (B, S, C)
        x = self.fc2(x)  # (B, S, E)
        if has_pad:
            x = x.masked_fill(mask.unsqueeze(-1), 0.0)
        x = grad_multiply(x, self.grad_scale)  # forward unchanged, backward scaled
        y = (x + input_embedding) * SQRT_HALF  # (B, S, E); the embedding is not grad-scaled
        return {
            "encoder_out": (x, y),
            "encoder_padding_mask": mask if has_pad else None,
            "encoder_has_padding": any_pad,  # training only: whether the mask holds a pad
        }

    def _convolutions(self, x: torch.Tensor, mask_tb: torch.Tensor | None) -> torch.Tensor:
        """The gated convolution stack over time-major (S, B, C0) input, with its residual
        connections; ``mask_tb`` (S, B, 1) True at pads, or None. Returns (S, B, C)."""
        residuals = [x]
        for proj, conv, res in zip(
            self.projections, self.convolutions, self.residuals, strict=True
        ):
            if res > 0:
                residual = residuals[-res]
                residual = residual if proj is None else proj(residual)
            else:
                residual = None
            if mask_tb is not None:
                # zero the pads before each convolution: outputs then ignore the padding amount
                x = x.masked_fill(mask_tb, 0.0)
            x = F.dropout(x, p=self.dropout, training=self.training)
            k = conv.kernel_size[0]
            if k % 2 == 0:
                x = F.pad(x, (0, 0, 0, 0, (k - 1) // 2, k // 2))  # time axis: left, right
            x = conv(x)  # (S, B, 2C)
            x = F.glu(x, dim=2)  # (S, B, C): first half values, second half gates
            if residual is not None:
                x = (x + residual) * SQRT_HALF
            residuals.append(x)
        return x

    def reorder_encoder_out(self, encoder_out: EncoderOut, new_order: torch.Tensor) -> EncoderOut:
        """A new encoder_out whose row i is row ``new_order[i]`` (beam expansion, shrinking)."""
        x, y = encoder_out["encoder_out"]
        mask = encoder_out["encoder_padding_mask"]
        return {
            "encoder_out": (x.index_select(0, new_order), y.index_select(0, new_order)),
            "encoder_padding_mask": None if mask is None else mask.index_select(0, new_order),
        }

    def max_positions(self) -> int:
        """The longest source (in tokens, EOS included) the position table can number."""
        return self.embed_positions.max_positions
