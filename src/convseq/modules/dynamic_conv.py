"""Dynamic convolution (Wu et al. 2019, "Pay Less Attention"): a depthwise convolution whose
kernel every position predicts from its own input (fairseq 0.12's DynamicConv1dTBC, plain PyTorch).

Channels split into ``num_heads`` heads of ``R = C / H`` channels; at position ``t`` a linear layer
maps the input (or a separate query) to one kernel of ``K`` taps per head, optionally softmax
-normalised over its taps, and output ``t`` of head ``h`` is ``sum_k w[t, h, k] * x[t - padding_l + k]``
over that head's channels, zeros standing for positions outside the sequence. Two forms compute
the same thing: unfold (windows of the padded input, one small product per position) and band
(each row's kernels laid into a (T, T) band matrix, one product per row and head).
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
    valid_taps,
)
from convseq.modules.linearized_conv import IncrementalState

__all__ = ["DynamicConv1dTBC", "band_matrix", "default_unfold"]


class DynamicConv1dTBC(HeadConv1dTBC):
    """Dynamic convolution over (T, B, C) inputs, parameters as fairseq's DynamicConv1dTBC.

    Args:
        input_size: channels C (input and output).
        kernel_size: taps K.
        padding_l: taps left of the current position: K - 1 is causal (a decoder; None means
            that), (K - 1) // 2 centred (an encoder).
        num_heads: heads H (C must divide by H); the kernel of each head is shared by its channels.
        weight_dropout: DropConnect on the (normalised) kernels, in training only.
        weight_softmax: softmax each kernel over its taps.
        renorm_padding: with weight_softmax, the softmax covers only the taps inside the sequence.
        bias: a bias in the kernel-predicting linear layer (always one with in_proj, as fairseq).
        conv_bias: a bias (C,) added to the output.
        query_size: channels of a separate query that predicts the kernels (default C).
        in_proj: one linear layer C -> C + H * K gives both the convolved input and the kernels.
        trim_short_kernel: fairseq's teacher-forced short-sequence case: with causal padding,
            weight softmax and a full forward over T < K positions, the softmax covers only the
            last T taps (see `_trim_short`); incremental decoding is unchanged.
    """

    def __init__(
        self,
        input_size: int,
        kernel_size: int = 1,
        padding_l: int | None = None,
        num_heads: int = 1,
        weight_dropout: float = 0.0,
        weight_softmax: bool = False,
        renorm_padding: bool = False,
        bias: bool = False,
        conv_bias: bool = False,
        query_size: int | None = None,
        in_proj: bool = False,
        trim_short_kernel: bool = False,
    ):
        padding_l = kernel_size - 1 if padding_l is None else padding_l
        if input_size % num_heads:
            raise ValueError(f"input_size {input_size} does not divide into {num_heads} heads")
        if not 0 <= padding_l < kernel_size:
            raise ValueError(f"padding_l must lie in 0..{kernel_size - 1}, got {padding_l}")
        super().__init__(
            input_size, kernel_size, padding_l, num_heads, weight_dropout, weight_softmax
        )
        self.query_size = input_size if query_size is None else query_size
        self.renorm_padding = renorm_padding
        self.trim_short_kernel = trim_short_kernel
        kernels = num_heads * kernel_size
        if in_proj:
            self.weight_linear = nn.Linear(input_size, input_size + kernels)
        else:
            self.weight_linear = nn.Linear(self.query_size, kernels, bias=bias)
        # fairseq's Linear helper: xavier weight, zero bias (its draw is kept so that one seed
        # gives fairseq's values), which reset_parameters then overrides
        nn.init.xavier_uniform_(self.weight_linear.weight)
        if self.weight_linear.bias is not None:
            nn.init.zeros_(self.weight_linear.bias)
        self.conv_bias = nn.Parameter(torch.empty(input_size)) if conv_bias else None
        self.reset_parameters()

    @property
    def in_proj(self) -> bool:
        return (
            self.weight_linear.out_features == self.input_size + self.num_heads * self.kernel_size
        )

    def reset_parameters(self) -> None:
        """As fairseq: PyTorch's default Linear init (it replaces the xavier one), zero conv_bias."""
        self.weight_linear.reset_parameters()
        if self.conv_bias is not None:
            nn.init.zeros_(self.conv_bias)

    def forward(
        self,
        x: torch.Tensor,
        incremental_state: IncrementalState | None = None,
        query: torch.Tensor | None = None,
        unfold: bool | None = None,
    ) -> torch.Tensor:
        """(T, B, C) -> (T, B, C).

        Args:
            x: the input; in incremental mode the T newest positions (one step or several).
            incremental_state: the caller's decoding cache (the last K - 1 inputs); needs a
                causal padding_l (K - 1).
            query: (T, B, query_size) predicting the kernels instead of x (not with in_proj).
            unfold: the unfold form (True) or the band form (False); None: `choose_unfold`'s pick.
        """
        if query is not None and self.in_proj:
            raise ValueError("a separate query cannot be used with in_proj")
        x, logits = self._project(x, query)  # (T, B, C), (T, B, H, K)
        if incremental_state is not None:
            output = self._forward_incremental(x, logits, incremental_state)
        else:
            logits = self._trim_short(logits)  # the full forward only, as fairseq's
            forms = (self._forward_band, self._forward_unfolded)
            if unfold is None:
                unfold = self._choose_unfold(forms, x, logits)
            output = forms[unfold](x, logits)  # (T, B, C)
        if self.conv_bias is not None:
            output = output + self.conv_bias  # (T, B, C)
        return output

    def _project(
        self, x: torch.Tensor, query: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The convolved input (T, B, C) and the kernel logits (T, B, H, K)."""
        length, rows, channels = x.shape
        if self.in_proj:
            proj = self.weight_linear(x)  # (T, B, C + H * K)
            x, logits = proj[..., :channels], proj[..., channels:]  # (T, B, C), (T, B, H * K)
        else:
            logits = self.weight_linear(x if query is None else query)  # (T, B, H * K)
        return x, logits.reshape(length, rows, self.num_heads, self.kernel_size)

    def _trim_short(self, logits: torch.Tensor) -> torch.Tensor:
        """With trim_short_kernel, causal padding, weight softmax and T < K: the first K - T taps'
        logits set to -inf, so that the softmax covers only the last T taps.

        Why: fairseq 0.12's LightConv model builds DynamicConv_scripatable, whose forward always
        takes its unfold form (dynamic_convolution.py:411), and that form, in training and in
        eval alike, narrows each predicted kernel to its last T taps before the softmax when
        K > T and padding_l == K - 1 (dynamic_convolution.py:455-457, softmax at 462). A model
        trained in fairseq is trained on that output. The dropped taps only ever read positions
        before the sequence (zeros), so without softmax nothing changes. fairseq's incremental
        form (and so its generation) normalises over all K taps instead; the trimmed output at a
        position depends on the whole length T, which no incremental decoder can know, so
        incremental decoding here stays fairseq's incremental form.
        """
        length, k = logits.size(0), self.kernel_size
        if not (self.trim_short_kernel and self.weight_softmax):
            return logits
        if length >= k or self.padding_l != k - 1:
            return logits
        dropped = torch.arange(k, device=logits.device) < k - length  # (K,)
        return logits.masked_fill(dropped, float("-inf"))  # (T, B, H, K)

    def _kernels(self, logits: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """(T, B, H, K) logits -> kernels: softmax over the taps (the valid ones), DropConnect."""
        if self.weight_softmax:
            if valid is not None:  # renorm_padding: taps outside the sequence get no weight
                logits = logits.masked_fill(~valid[:, None, None, :], float("-inf"))
            logits = F.softmax(logits, dim=-1)  # (T, B, H, K)
        return F.dropout(logits, self.weight_dropout, self.training)

    def _valid(self, first: int, count: int, length: int, device: torch.device):
        """The valid-tap mask renorm_padding needs, or None without it."""
        if not (self.renorm_padding and self.weight_softmax):
            return None
        return valid_taps(first, count, self.kernel_size, self.padding_l, length, device)

    def _apply_windows(self, windows: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
        """(T, B, C, K) windows and (T, B, H, K) kernels -> (T, B, C)."""
        length, rows, channels, k = windows.shape
        heads = length * rows * self.num_heads
        # (T * B * H, R, K): a view when the windows come from a contiguous padded input
        windows = windows.reshape(heads, channels // self.num_heads, k)
        out = torch.bmm(windows, kernels.reshape(heads, k, 1))  # (T * B * H, R, 1)
        return out.view(length, rows, channels)

    def _forward_unfolded(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The unfold form: each position's window times its kernel. (T, B, C) -> (T, B, C)."""
        kernels = self._kernels(logits, self._valid(0, x.size(0), x.size(0), x.device))
        windows = padded_windows(x, self.kernel_size, self.padding_l)  # (T, B, C, K)
        return self._apply_windows(windows, kernels)

    def _forward_band(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The band form: per row and head, a (T, T) band matrix times the input."""
        length, rows, channels = x.shape
        heads, k = self.num_heads, self.kernel_size
        kernels = self._kernels(logits, self._valid(0, length, length, x.device))  # (T, B, H, K)
        kernels = kernels.permute(1, 2, 0, 3).reshape(rows * heads, length, k)  # (B * H, T, K)
        band = band_matrix(kernels, self.padding_l)  # (B * H, T, T)
        xs = x.reshape(length, rows * heads, channels // heads).transpose(0, 1)  # (B * H, T, R)
        out = torch.bmm(band, xs)  # (B * H, T, R)
        return out.transpose(0, 1).reshape(length, rows, channels)

    def _forward_incremental(
        self, x: torch.Tensor, logits: torch.Tensor, incremental_state: IncrementalState
    ) -> torch.Tensor:
        """The T newest positions (one step or several) after the cached inputs: (T, B, C)."""
        # (T, B, C, K): the new positions' windows, after `first` cached inputs
        windows, first = self._cached_windows(x, incremental_state)
        kernels = self._kernels(logits, self._valid(first, x.size(0), first + x.size(0), x.device))
        return self._apply_windows(windows, kernels)

    def extra_repr(self) -> str:
        switches: dict[str, object] = {
            "conv_bias": self.conv_bias is not None,
            "renorm_padding": self.renorm_padding,
            "in_proj": self.in_proj,
        }
        if self.trim_short_kernel:
            switches["trim_short_kernel"] = True
        if self.query_size != self.input_size:
            switches["query_size"] = self.query_size
        return self._describe(**switches)
