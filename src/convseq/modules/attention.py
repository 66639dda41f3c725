"""fconv's attention layer: one per decoder layer, over the encoder's (keys, values)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from convseq.modules.beamable_mm import beamable_bmm
from convseq.modules.layers import linear

SQRT_HALF = math.sqrt(0.5)


class AttentionLayer(nn.Module):
    """Dot-product attention of a decoder layer (Gehring et al. 2017, eq. 1-2, fairseq's maths).

    ``d = (W_in h + g) * sqrt(.5)`` with g the target embedding; ``a = softmax(d . keys)`` over
    the real source positions; ``c = (a . values) * sqrt(s)`` with s the real source length;
    output ``(W_out c + h) * sqrt(.5)``.

    Attributes:
        beam_size: when set (generation only), single-step products are done once per sentence
            (`beamable_bmm`), assuming rows come in blocks of ``beam_size`` copies.
    """

    def __init__(self, conv_channels: int, embed_dim: int):
        super().__init__()
        self.in_projection = linear(conv_channels, embed_dim)  # conv channels -> embedding
        self.out_projection = linear(embed_dim, conv_channels)  # embedding -> conv channels
        self.beam_size: int | None = None

    def forward(
        self,
        x: torch.Tensor,
        target_embedding: torch.Tensor,
        encoder_out: tuple[torch.Tensor, torch.Tensor],
        encoder_padding_mask: torch.Tensor | None,
        has_padding: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend from every target position.

        Args:
            x: (B, T, C) the layer's GLU output.
            target_embedding: (B, T, E) the decoder input embedding (tokens + positions).
            encoder_out: keys (B, E, S) (pre-transposed) and values (B, S, E).
            encoder_padding_mask: (B, S) True at source pads, or None without padding.
            has_padding: () bool on the device, whether the mask holds a pad (training gives
                the mask always and this flag, so that no host read decides the scaling), or
                None: the mask, when given, holds one.

        Returns:
            (B, T, C) the output and (B, T, S) the attention weights.
        """
        keys, values = encoder_out
        residual = x
        beam = None if self.training else self.beam_size
        d = (self.in_projection(x) + target_embedding) * SQRT_HALF  # (B, T, E)
        scores = beamable_bmm(d, keys, beam)  # (B, T, S)
        if encoder_padding_mask is not None:
            # in fp32 and back, so -inf and the softmax behave under fp16 / bf16
            scores = (
                scores.float()
                .masked_fill(encoder_padding_mask.unsqueeze(1), float("-inf"))
                .type_as(scores)
            )  # (B, T, S)
        attn = F.softmax(scores, dim=-1)  # (B, T, S)
        context = beamable_bmm(attn, values, beam)  # (B, T, E)
        s = values.size(1)
        if encoder_padding_mask is None:
            context = context * (s * math.sqrt(1.0 / s))  # sqrt(s), as fairseq writes it
        else:
            real = s - encoder_padding_mask.type_as(context).sum(dim=1, keepdim=True)  # (B, 1)
            real = real.unsqueeze(-1)  # (B, 1, 1)
            padded = context * (real * real.rsqrt())  # (B, T, E) times sqrt(real length)
            if has_padding is None:
                context = padded
            else:  # both scalings, chosen on the device: each exactly as its own branch
                context = torch.where(has_padding, padded, context * (s * math.sqrt(1.0 / s)))
        out = (self.out_projection(context) + residual) * SQRT_HALF  # (B, T, C)
        return out, attn
