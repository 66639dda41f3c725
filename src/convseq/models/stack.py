"""What fconv's encoder and decoder build alike: token and position embeddings, fc1, and a stack
of gated convolutions with residual connections.

The modules are created in fairseq's order (embeddings, fc1, then per layer its residual
projection, its convolution and what else the layer holds), so that a seed gives fairseq's
initial weights; the caller registers them in the same order, which keeps fairseq's state-dict
names and parameter order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import nn

from convseq.models.spec import LayerSpec
from convseq.modules.layers import embedding, linear, positional_embedding


@dataclass
class ConvStack:
    """The shared parts, made by `conv_stack`, for the encoder or decoder to register."""

    embed_tokens: nn.Embedding
    embed_positions: nn.Module
    fc1: nn.Module  # embeddings -> the first layer's channels
    projections: nn.ModuleList  # per layer: a linear from the residual's channels, or None
    convolutions: nn.ModuleList  # per layer: `conv(in_channels, out_channels, kernel)`
    extras: nn.ModuleList  # per layer i: `extra(i, out_channels)` (the decoder's attention)
    residuals: list[int]  # per layer: how many layers back its residual comes from (0: none)
    out_channels: int  # the last layer's channels


def conv_stack(
    num_embeddings: int,
    embed_dim: int,
    max_positions: int,
    padding_idx: int,
    layers: Sequence[LayerSpec],
    dropout: float,
    conv: Callable[[int, int, int], nn.Module],
    extra: Callable[[int, int], nn.Module | None] | None = None,
) -> ConvStack:
    """Embeddings, fc1 and one convolution (`conv`, plus `extra` if given) per layer spec."""
    embed_tokens = embedding(num_embeddings, embed_dim, padding_idx)
    embed_positions = positional_embedding(max_positions, embed_dim, padding_idx)
    in_channels = layers[0][0]
    fc1 = linear(embed_dim, in_channels, dropout=dropout)
    projections, convolutions, extras = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
    residuals: list[int] = []
    layer_in_channels = [in_channels]
    for i, (out_channels, kernel, residual) in enumerate(layers):
        residual_dim = out_channels if residual == 0 else layer_in_channels[-residual]
        projections.append(
            linear(residual_dim, out_channels) if residual_dim != out_channels else None
        )
        convolutions.append(conv(in_channels, out_channels, kernel))
        if extra is not None:
            extras.append(extra(i, out_channels))
        residuals.append(residual)
        in_channels = out_channels
        layer_in_channels.append(out_channels)
    return ConvStack(
        embed_tokens,
        embed_positions,
        fc1,
        projections,
        convolutions,
        extras,
        residuals,
        in_channels,
    )
