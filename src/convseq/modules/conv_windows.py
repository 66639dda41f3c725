"""What the lightweight and dynamic convolutions share: the K-wide windows of a padded (T, B, C)
input (the unfold form), the band matrix of per-row kernels (the band form), the cache of the last
K - 1 inputs that incremental decoding keeps, the default choice between the two forms, and
`HeadConv1dTBC`, the base class that holds both layers' settings and their cache.

A convolution with ``padding_l`` taps left of the current position reads, for output t and tap k,
input ``t - padding_l + k``; positions outside 0..T-1 read zeros.
"""

from __future__ import annotations

import uuid

import torch
import torch.nn.functional as F
from torch import nn

from convseq.modules.linearized_conv import IncrementalState

# Above this length the band form is not chosen by default: its (N, T, T) matrix grows with the
# square of the length (fairseq's DynamicConv1dTBC switches to unfold above 512 as well).
BAND_MAX_LENGTH = 512


def default_unfold(length: int, incremental: bool = False) -> bool:
    """Whether a forward that was not told which form to use takes the unfold form.

    Why: fairseq's rule, so that a default run computes what fairseq computes. An incremental
    step holds only the new positions and the K - 1 inputs before them, which is the unfold
    form's window and not a whole band; a long sequence would make the band matrix (B * H * T**2
    numbers) quadratic in memory, where the unfold form holds B * C * T * K. Otherwise the band
    form: one batched (T, T) @ (T, R) product, fast for sentence-length inputs. (A choice by
    measured speed is to replace this rule.)
    """
    return incremental or length > BAND_MAX_LENGTH


def padded_windows(x: torch.Tensor, kernel_size: int, padding_l: int) -> torch.Tensor:
    """(T, B, C) -> (T, B, C, K): window t holds inputs t - padding_l + k, zeros outside 0..T-1."""
    right = kernel_size - 1 - padding_l
    padded = F.pad(x, (0, 0, 0, 0, padding_l, right))  # (T + K - 1, B, C)
    return padded.unfold(0, kernel_size, 1)  # (T, B, C, K), a view of `padded`


def band_matrix(weights: torch.Tensor, padding_l: int) -> torch.Tensor:
    """(N, T, K) kernels -> (N, T, T): row t holds w[t, k] at column t - padding_l + k.

    ``out[t] = sum_s M[t, s] * x[s]`` is then the convolution of a sequence of length T.
    No in-place write: each row is padded with T zeros to width K + T, and reading the flat rows
    with width K + T - 1 instead shifts row t right by t columns (w[t, k] lands at column t + k).
    """
    n, length, k = weights.shape
    wide = F.pad(weights, (0, length))  # (N, T, K + T)
    flat = wide.reshape(n, length * (length + k))[:, : length * (length + k - 1)]
    band = flat.view(n, length, length + k - 1)  # (N, T, T + K - 1), w[t, k] at column t + k
    return band[:, :, padding_l : padding_l + length]  # (N, T, T)


def valid_taps(
    first: int, count: int, kernel_size: int, padding_l: int, length: int, device: torch.device
) -> torch.Tensor:
    """(count, K) bool: whether tap k of output position first + i reads inside 0..length-1."""
    positions = torch.arange(first, first + count, device=device).unsqueeze(1)  # (count, 1)
    taps = torch.arange(kernel_size, device=device).unsqueeze(0)  # (1, K)
    read = positions - padding_l + taps  # (count, K): the input position each tap reads
    return (read >= 0) & (read < length)


def incremental_windows(
    x: torch.Tensor,
    incremental_state: IncrementalState,
    key: str,
    kernel_size: int,
    padding_l: int,
) -> tuple[torch.Tensor, int]:
    """The causal windows of the T newest inputs after the cached ones, and where they start.

    Returns (windows (T, B, C, K), first): ``first`` is the number of cached inputs P (at most
    K - 1) before ``x``, so the new positions are first .. first + T - 1 of a sequence of
    first + T inputs. Stores the last K - 1 inputs under ``key``: a new tensor each call (a
    reordered or saved state is never written through), detached (a cached input never keeps an
    earlier step's graph alive).
    """
    k = kernel_size
    if padding_l != k - 1:
        raise ValueError(
            f"incremental decoding needs a causal convolution (padding_l = kernel_size - 1 "
            f"= {k - 1}), got padding_l={padding_l}"
        )
    previous = incremental_state.get(key)  # (P, B, C), P <= K - 1, or None
    assert previous is None or isinstance(previous, torch.Tensor)
    full = x if previous is None else torch.cat([previous, x], dim=0)  # (P + T, B, C)
    if k > 1:
        incremental_state[key] = full[-(k - 1) :].detach()  # (<= K - 1, B, C)
    first = full.size(0) - x.size(0)
    return padded_windows(full, k, k - 1)[first:], first  # (T, B, C, K): the new positions'


def reorder_cache(incremental_state: IncrementalState, key: str, new_order: torch.Tensor) -> None:
    """Keep row ``new_order[i]``'s cached inputs as row ``i`` (beam moves, batch shrinking)."""
    buffer = incremental_state.get(key)  # (P, B, C)
    if buffer is not None:
        assert isinstance(buffer, torch.Tensor)
        incremental_state[key] = buffer.index_select(1, new_order)  # (P, B', C)


class HeadConv1dTBC(nn.Module):
    """What both convolutions hold: their settings, their entry in the caller's incremental state
    (the last K - 1 inputs) and its reorder, and the start of their ``extra_repr``.

    No parameters: each layer registers its own, in fairseq's order.
    """

    def __init__(
        self,
        input_size: int,
        kernel_size: int,
        padding_l: int,
        num_heads: int,
        weight_dropout: float,
        weight_softmax: bool,
    ):
        super().__init__()
        self.input_size = input_size
        self.kernel_size = kernel_size
        self.padding_l = padding_l
        self.num_heads = num_heads
        self.weight_dropout = weight_dropout
        self.weight_softmax = weight_softmax
        # names this module's entry in an incremental_state shared by the whole decoder
        self._state_key = f"{uuid.uuid4().hex}.input_buffer"

    def _cached_windows(
        self, x: torch.Tensor, incremental_state: IncrementalState
    ) -> tuple[torch.Tensor, int]:
        """`incremental_windows` of this layer: (T, B, C, K) windows, cached inputs before x."""
        return incremental_windows(
            x, incremental_state, self._state_key, self.kernel_size, self.padding_l
        )

    def reorder_incremental_state(
        self, incremental_state: IncrementalState, new_order: torch.Tensor
    ) -> None:
        """Keep row ``new_order[i]``'s cached inputs as row ``i`` (beam moves, batch shrinking)."""
        reorder_cache(incremental_state, self._state_key, new_order)

    def _describe(self, **switches: object) -> str:
        """The ``extra_repr``: C, K, padding_l, H, weight_softmax, the layer's own ``switches``
        in order, then weight_dropout when it is on."""
        text = (
            f"{self.input_size}, kernel_size={self.kernel_size}, padding_l={self.padding_l}, "
            f"num_heads={self.num_heads}, weight_softmax={self.weight_softmax}"
        )
        text += "".join(f", {name}={value}" for name, value in switches.items())
        if self.weight_dropout > 0:
            text += f", weight_dropout={self.weight_dropout}"
        return text
