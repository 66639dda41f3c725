"""Lightweight convolution (Wu et al. 2019), fairseq 0.12's LightweightConv1dTBC in plain PyTorch.

A depthwise convolution over time whose kernels are shared within heads: the C channels fall in
H heads of R = C / H consecutive channels, and every channel of head h is convolved with the
head's kernel ``weight[h, 0, :]`` (softmax-normalised over its K taps when ``weight_softmax``).
Output t of channel c is ``sum_k w[h(c), k] * x[t + k - padding_l, c]`` (zeros outside the
sequence), plus ``bias[c]``.

Two forms compute it (fairseq's ``_forward_unfolded`` and ``_forward_expanded``):

* unfold: the padded input cut into K-wide windows, each contracted with its head's kernel;
* band: each head's kernel laid out as a (T, T) band matrix, one batched matmul with the input.

Incremental decoding (causal, ``padding_l = kernel_size - 1``) keeps the last K-1 inputs in the
caller's ``incremental_state``; any number of new positions may be fed at once, and each gets
the output the full forward gives it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from convseq.modules.conv_windows import (
    HeadConv1dTBC,
    band_matrix,
    default_unfold,
    padded_windows,
)
from convseq.modules.linearized_conv import IncrementalState

__all__ = ["LightweightConv1dTBC", "default_unfold"]


class LightweightConv1dTBC(HeadConv1dTBC):
    """Lightweight convolution on (T, B, C) inputs, with fairseq's parameters and init.

    Args:
        input_size: channels C of the input and output (a multiple of ``num_heads``).
        kernel_size: taps K of each head's kernel.
        padding_l: zeros before the sequence: K - 1 for a causal decoder, (K - 1) // 2 for a
            centred encoder (between 0 and K - 1; K - 1 - padding_l zeros go after it).
        num_heads: heads H; the kernel ``weight`` is (H, 1, K).
        weight_dropout: DropConnect probability on the normalised kernel (training only).
        weight_softmax: softmax-normalise each head's kernel over its taps.
        bias: add a learned (C,) bias.
    """

    def __init__(
        self,
        input_size: int,
        kernel_size: int,
        padding_l: int,
        num_heads: int = 1,
        weight_dropout: float = 0.0,
        weight_softmax: bool = False,
        bias: bool = False,
    ):
        _check_settings(input_size, kernel_size, padding_l, num_heads, weight_dropout)
        super().__init__(
            input_size, kernel_size, padding_l, num_heads, weight_dropout, weight_softmax
        )
        self.weight = nn.Parameter(torch.empty(num_heads, 1, kernel_size))
        self.bias: nn.Parameter | None
        if bias:
            self.bias = nn.Parameter(torch.empty(input_size))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """fairseq's init: Xavier-uniform kernels, zero bias."""
        nn.init.xavier_uniform_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(
        self,
        x: torch.Tensor,
        incremental_state: IncrementalState | None = None,
        unfold: bool | None = None,
    ) -> torch.Tensor:
        """(T, B, C) -> (T, B, C).

        With ``incremental_state``, ``x`` holds the next T positions (one or several) of a causal
        sequence whose earlier inputs the state remembers; the unfold form is always used then.
        ``unfold`` None: the form `choose_unfold` picks (by measured speed by default).
        """
        kernel = self._kernel()  # (H, K)
        if incremental_state is not None:
            windows, _ = self._cached_windows(x, incremental_state)  # (T, B, C, K)
            out = self._contract_windows(windows, kernel)  # (T, B, C)
        else:
            forms = (self._band_product, self._unfolded)
            if unfold is None:
                unfold = self._choose_unfold(forms, x, kernel)
            out = forms[unfold](x, kernel)  # (T, B, C)
        if self.bias is not None:
            out = out + self.bias  # (T, B, C)
        return out

    def _kernel(self) -> torch.Tensor:
        """The (H, K) kernels, softmax-normalised over the taps when ``weight_softmax``."""
        kernel = self.weight.view(self.num_heads, self.kernel_size)  # (H, K)
        if not self.weight_softmax:
            return kernel
        # fairseq normalises in float32 (half-precision weights come back in their dtype);
        # float64 weights stay float64, so that a float64 gradcheck keeps its precision
        low = kernel.dtype in (torch.float16, torch.bfloat16)
        dtype = torch.float32 if low else kernel.dtype
        return torch.softmax(kernel, dim=1, dtype=dtype).type_as(kernel)  # (H, K)

    def _unfolded(self, x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
        """(T, B, C) and (H, K) kernels -> (T, B, C): the unfold form."""
        windows = padded_windows(x, self.kernel_size, self.padding_l)  # (T, B, C, K)
        return self._contract_windows(windows, kernel)

    def _contract_windows(self, windows: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
        """(T, B, C, K) windows and (H, K) kernels -> (T, B, C): the unfold form's product."""
        steps, rows, channels, taps = windows.shape
        heads = kernel.size(0)
        per_head = windows.reshape(steps, rows, heads, channels // heads, taps)  # (T, B, H, R, K)
        if self.training and self.weight_dropout > 0:
            # DropConnect: each position of each row draws its own mask, as fairseq's does
            kernel = kernel.expand(steps, rows, heads, taps)  # (T, B, H, K)
            kernel = F.dropout(kernel, self.weight_dropout, training=True)  # (T, B, H, K)
        # one K-long dot product per (t, b, h, r), like fairseq's bmm
        out = torch.matmul(per_head, kernel.unsqueeze(-1))  # (T, B, H, R, 1)
        return out.reshape(steps, rows, channels)  # (T, B, C)

    def _band_product(self, x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
        """(T, B, C) and (H, K) kernels -> (T, B, C): the band-matrix form's product."""
        steps, rows, channels = x.shape
        heads, taps = kernel.shape
        per_row = kernel.unsqueeze(1).expand(heads, steps, taps)  # (H, T, K): one kernel per row
        band = band_matrix(per_row, self.padding_l)  # (H, T, T)
        if self.training and self.weight_dropout > 0:
            # DropConnect on each row's own copy of the band, as fairseq's (B*H, T, T) one
            band = band.expand(rows, heads, steps, steps)  # (B, H, T, T)
            band = F.dropout(band, self.weight_dropout, training=True)  # (B, H, T, T)
        per_head = x.view(steps, rows, heads, channels // heads)  # (T, B, H, R)
        per_head = per_head.permute(1, 2, 0, 3)  # (B, H, T, R)
        out = torch.matmul(band, per_head)  # (B, H, T, R)
        return out.permute(2, 0, 1, 3).reshape(steps, rows, channels)  # (T, B, C)

    def extra_repr(self) -> str:
        return self._describe(bias=self.bias is not None)


def _check_settings(
    input_size: int, kernel_size: int, padding_l: int, num_heads: int, weight_dropout: float
) -> None:
    """Refuse settings the convolution cannot honour, naming the argument."""
    if kernel_size < 1:
        raise ValueError(f"kernel_size: at least 1, got {kernel_size}")
    if not 0 <= padding_l <= kernel_size - 1:
        raise ValueError(
            f"padding_l: between 0 and kernel_size - 1 = {kernel_size - 1}, got {padding_l}"
        )
    if num_heads < 1 or input_size % num_heads:
        raise ValueError(f"num_heads: must divide input_size = {input_size}, got {num_heads}")
    if not 0.0 <= weight_dropout < 1.0:
        raise ValueError(f"weight_dropout: a probability in [0, 1), got {weight_dropout}")
