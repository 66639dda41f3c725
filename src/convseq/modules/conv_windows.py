"""What the lightweight and dynamic convolutions share: the K-wide windows of a padded (T, B, C)
input (the unfold form), the band matrix of per-row kernels (the band form), the cache of the last
K - 1 inputs that incremental decoding keeps, the choice between the two forms (measured, see
`choose_unfold`), and `HeadConv1dTBC`, the base class that holds both layers' settings and their
cache.

A convolution with ``padding_l`` taps left of the current position reads, for output t and tap k,
input ``t - padding_l + k``; positions outside 0..T-1 read zeros.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from convseq.modules.linearized_conv import IncrementalState

# Above this length the band form is never measured nor chosen by default: its (N, T, T) matrix
# grows with the square of the length (fairseq's DynamicConv1dTBC switches to unfold above 512).
BAND_MAX_LENGTH = 512

# How a full forward that was not told its form picks one: "measure" (time both forms once per
# shape class and keep the faster, like cuDNN's benchmark mode), "length" (fairseq's rule,
# `default_unfold`), or "band" / "unfold" (that form always). CONVSEQ_CONV_FORM sets it at import.
FORM_MODES = ("measure", "length", "band", "unfold")  # the first is the default
# the mode the user chose (None: none); `training_forms` then keeps it
_USER_MODE = os.environ.get("CONVSEQ_CONV_FORM")
_settings = {"mode": FORM_MODES[0] if _USER_MODE is None else _USER_MODE}
if _settings["mode"] not in FORM_MODES:
    raise ValueError(f"CONVSEQ_CONV_FORM: one of {FORM_MODES}, got {_settings['mode']!r}")
MEASURE_REPEATS = 3  # timed calls of each form (after one untimed), the fastest one counts


class FormKey(NamedTuple):
    """The shape class a measured choice holds for: where and how the convolution runs, its
    kind and kernel size, the length and the B * H rows (each rounded up to a power of two), the
    channels per head, whether a backward follows, and the thread count."""

    device: str
    dtype: torch.dtype
    conv: str
    kernel_size: int
    length: int
    rows: int
    per_head: int
    backward: bool
    threads: int


# The measured winners: True where the unfold form was the faster (one process, never saved).
MEASURED: dict[FormKey, bool] = {}


def set_conv_form(mode: str) -> str:
    """Set how forms are chosen (one of `FORM_MODES`); returns the mode it replaces."""
    if mode not in FORM_MODES:
        raise ValueError(f"conv form: one of {FORM_MODES}, got {mode!r}")
    old, _settings["mode"] = _settings["mode"], mode
    return old


@contextlib.contextmanager
def conv_form(mode: str) -> Iterator[None]:
    """`set_conv_form(mode)` for the ``with`` block, the previous mode restored after it."""
    old = set_conv_form(mode)
    try:
        yield
    finally:
        set_conv_form(old)


@contextlib.contextmanager
def training_forms() -> Iterator[None]:
    """The forms a training run takes: fairseq's length rule, the same in every process.

    Measured choices are made per process and the two forms round differently, so a run resumed
    in a fresh process, a DDP rank or a repeat of the run could compute other last bits than the
    straight run; the length rule keeps resume and repeats bit for bit. A mode the user set with
    CONVSEQ_CONV_FORM is kept (``measure`` trains with measured forms, without that guarantee).
    """
    if _USER_MODE is not None:
        yield
        return
    with conv_form("length"):
        yield


def default_unfold(length: int, incremental: bool = False) -> bool:
    """fairseq's rule (the "length" mode): unfold when incremental or longer than 512.

    Why: an incremental step holds only the new positions and the K - 1 inputs before them,
    which is the unfold form's window and not a whole band; a long sequence would make the band
    matrix (B * H * T**2 numbers) quadratic in memory, where the unfold form holds B * C * T * K.
    """
    return incremental or length > BAND_MAX_LENGTH


def bucket(n: int) -> int:
    """``n`` rounded up to a power of two: one measurement serves a range of sizes."""
    return 1 << max(n - 1, 0).bit_length()


def form_key(
    conv: str, x: torch.Tensor, kernel_size: int, num_heads: int, backward: bool
) -> FormKey:
    """The `FormKey` of a (T, B, C) input ``x`` to a convolution of kind ``conv``."""
    length, rows, channels = x.shape
    return FormKey(
        x.device.type, x.dtype, conv, kernel_size, bucket(length), bucket(rows * num_heads),
        channels // num_heads, backward, torch.get_num_threads(),
    )  # fmt: skip


def choose_unfold(
    key: FormKey,
    length: int,
    forms: tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]],
    inputs: tuple[torch.Tensor, ...],
) -> bool:
    """Whether a full forward of ``length`` positions takes the unfold form.

    ``forms`` are the (band, unfold) functions of ``inputs``; ``key`` names the shape class.
    In "measure" mode the first call of a class times both (see `measure_forms`) and later calls
    reuse the winner; lengths above `BAND_MAX_LENGTH` always unfold (the band is quadratic in
    memory), and under tracing or compilation fairseq's rule decides (no timing in a graph).
    """
    mode = _settings["mode"]
    if mode in ("band", "unfold"):
        return mode == "unfold"
    if mode == "length" or length > BAND_MAX_LENGTH or _tracing():
        return default_unfold(length)
    if key not in MEASURED:
        MEASURED[key] = measure_forms(forms, inputs, key.backward)
    return MEASURED[key]


def _tracing() -> bool:
    compiling = getattr(torch.compiler, "is_compiling", lambda: False)
    return torch.jit.is_scripting() or torch.jit.is_tracing() or compiling()


def measure_forms(
    forms: tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]],
    inputs: tuple[torch.Tensor, ...],
    backward: bool,
) -> bool:
    """Time the (band, unfold) ``forms`` on copies of ``inputs``; True if unfold was faster.

    Each form runs once untimed, then `MEASURE_REPEATS` times alternately, forward and, with
    ``backward``, a backward of its output; the fastest run of each is compared (the least
    disturbed by other work). The random state is restored afterwards: the timing runs draw
    dropout masks, and the model's own draws must not depend on whether a shape was new.
    """
    copies = tuple(t.detach().requires_grad_(backward) for t in inputs)
    best = [float("inf"), float("inf")]
    devices = [copies[0].device] if copies[0].device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.set_grad_enabled(backward):
        for form in forms:
            _run_form(form, copies, backward)
        for _ in range(MEASURE_REPEATS):
            for i, form in enumerate(forms):
                best[i] = min(best[i], _run_form(form, copies, backward))
    return best[1] < best[0]


def _run_form(form: Callable[..., torch.Tensor], inputs: tuple, backward: bool) -> float:
    """Seconds of one call of ``form`` (and its backward), the device synchronised."""
    sync = torch.cuda.synchronize if inputs[0].device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    out = form(*inputs)
    if backward:
        out.backward(torch.ones_like(out))
    sync()
    return time.perf_counter() - start


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
    first + T inputs. Stores under ``key`` the last K - 1 inputs as (B, C, K - 1), time last,
    zeros before the sequence, and the number of inputs seen: a view of a tensor made here (a
    reordered or saved state is never written through), detached (a cached input never keeps an
    earlier step's graph alive).

    Why this layout: a step's windows are then one concatenation, read by the products as
    (B * H, R, K) without another copy; the next cache is a view of it; and no step pads (the
    zeros are made once), where padding K - 1 - P positions at every step of a short sequence
    would allocate, zero and copy the window again per layer.
    """
    k = kernel_size
    if padding_l != k - 1:
        raise ValueError(
            f"incremental decoding needs a causal convolution (padding_l = kernel_size - 1 "
            f"= {k - 1}), got padding_l={padding_l}"
        )
    cached = incremental_state.get(key)  # ((B, C, K - 1) inputs, count) or None
    if cached is None:
        buffer, seen = x.new_zeros(x.size(1), x.size(2), k - 1), 0  # (B, C, K - 1): all before
    else:
        assert isinstance(cached, tuple)
        buffer, seen = cached
    full = torch.cat([buffer, x.permute(1, 2, 0)], dim=2)  # (B, C, K - 1 + T)
    if k > 1:
        incremental_state[key] = (full[:, :, x.size(0) :].detach(), seen + x.size(0))
    return full.unfold(2, k, 1).permute(2, 0, 1, 3), min(seen, k - 1)  # (T, B, C, K), a view


def reorder_cache(incremental_state: IncrementalState, key: str, new_order: torch.Tensor) -> None:
    """Keep row ``new_order[i]``'s cached inputs as row ``i`` (beam moves, batch shrinking)."""
    cached = incremental_state.get(key)  # ((B, C, K - 1) inputs, count)
    if cached is not None:
        assert isinstance(cached, tuple)
        buffer, seen = cached
        incremental_state[key] = (buffer.index_select(0, new_order), seen)  # (B', C, K - 1)


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

    def _choose_unfold(
        self,
        forms: tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]],
        x: torch.Tensor,
        weights: torch.Tensor,
    ) -> bool:
        """`choose_unfold` for a full forward of (T, B, C) ``x`` with kernels (or their logits)
        ``weights``: the (band, unfold) ``forms`` are functions of (x, weights)."""
        backward = torch.is_grad_enabled() and (x.requires_grad or weights.requires_grad)
        conv = type(self).__name__
        key = form_key(conv, x, self.kernel_size, self.num_heads, backward)
        return choose_unfold(key, x.size(0), forms, (x, weights))

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
