"""A 1-d convolution over time-major (T, B, C) input, with fairseq's (k, in, out) weight layout."""

from __future__ import annotations

import math

import torch
from torch import nn


class ConvTBC(nn.Module):
    """Cross-correlation over time of a (T, B, C_in) tensor, zero-padded by ``padding`` each side.

    ``out[t] = bias + sum_j x_padded[t + j] @ weight[j]``; the weight is (k, C_in, C_out), the
    layout of fairseq's checkpoints. ``torch.conv_tbc`` runs it as k GEMMs, which beats a
    channels-first conv for the short kernels fconv uses and needs no layout transposes.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, padding: int = 0):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = (kernel_size,)
        self.padding = padding
        self.weight = nn.Parameter(torch.empty(kernel_size, in_channels, out_channels))
        self.bias = nn.Parameter(torch.zeros(out_channels))
        nn.init.normal_(self.weight, 0.0, math.sqrt(1.0 / (kernel_size * in_channels)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(T, B, C_in) -> (T + 2 * padding - k + 1, B, C_out)."""
        return torch.conv_tbc(x.contiguous(), self.weight, self.bias, self.padding)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"padding={self.padding}"
        )
