"""What every search shares: the model interface, argument checks, length limits and a phase timer.

Nothing here chooses hypotheses: the tensorized search (`beam.py`), the reference search
(`reference.py`) and greedy decoding (`greedy.py`) each do that their own way, so that the tests
comparing them compare two independent implementations.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, runtime_checkable

import torch
from torch import nn

from convseq.common.specials import EOS_ID, PAD_ID, UNK_ID

# the phases a search reports to its timer, in the order a step runs them:
# encoder; decoder (the step's decoder call, log-softmax included); candidates (masking,
# penalties, cumulative scores, the topk over beam x vocab: the same tensor work in every
# search); selection (which candidates finish, which continue); finalisation (building the
# finished hypotheses); reorder (state and history reordering, batch shrinking)
PHASES = ("encoder", "decoder", "candidates", "selection", "finalisation", "reorder")


class Hypothesis(TypedDict):
    """One finished translation, as fairseq's SequenceGenerator returns it."""

    tokens: torch.Tensor  # (L,) long, the output tokens ending in EOS (no leading EOS)
    score: float  # sum of log-probs, divided by L ** lenpen when scores are normalised
    positional_scores: torch.Tensor  # (L,) fp32, the log-prob of each token
    attention: torch.Tensor | None  # (src_len, L) layer-averaged attention, padding removed


# ---------------------------------------------------------------------------- the model interface


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
    ``generation_mode`` (convseq's FConvModel has them all).
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


# ---------------------------------------------------------------------------- arguments


@dataclass(frozen=True)
class SearchSettings:
    """A search's settings, as `convseq.search.beam_search` documents its arguments."""

    beam: int
    lenpen: float
    unk_penalty: float
    min_len: int
    max_len_a: float
    max_len_b: int
    nbest: int
    normalize_scores: bool
    fold_weight_norm: bool
    beamable_mm: bool
    need_attn: bool


@dataclass(frozen=True)
class SearchBatch:
    """A checked batch: the search model, the source, each sentence's length and last step."""

    model: SearchModel
    src_tokens: torch.Tensor  # (B, S) left-padded, each row ending in EOS
    src_lengths: torch.Tensor  # (B,) lengths, EOS included
    src_lens: list[int]  # the same lengths on the host (one read per batch)
    limits: list[int]  # each sentence's last step, where EOS is forced (`max_lengths`)


def run_search(
    search: Callable[[SearchBatch], list[list[Hypothesis]]],
    model: Any,
    src_tokens: torch.Tensor,
    src_lengths: torch.Tensor,
    settings: SearchSettings,
) -> list[list[Hypothesis]]:
    """What every search does around its own loop: check the arguments, answer an empty batch
    with no hypotheses, find each sentence's last step, and run ``search`` in inference mode
    under the model's generation mode (``beamable_mm``: attention products once per sentence).
    """
    s, m = settings, as_search_model(model)
    check_arguments(src_tokens, src_lengths, s.beam, s.nbest, s.min_len, s.lenpen, s.unk_penalty)
    if src_tokens.size(0) == 0:
        return []
    src_lens = src_lengths.tolist()  # one host read per batch
    width, positions = src_tokens.size(1), m.max_target_positions()
    limits = max_lengths(src_lens, s.max_len_a, s.max_len_b, positions, s.min_len, width)
    batch = SearchBatch(m, src_tokens, src_lengths, src_lens, limits)
    beam_size = s.beam if s.beamable_mm else None
    with torch.inference_mode(), m.generation_context(beam_size, s.fold_weight_norm, s.need_attn):
        return search(batch)


def check_arguments(
    src_tokens: torch.Tensor,
    src_lengths: torch.Tensor,
    beam: int,
    nbest: int,
    min_len: int,
    lenpen: float,
    unk_penalty: float = 0.0,
) -> None:
    """Refuse shapes and settings no search can honour, naming the argument."""
    if src_tokens.dim() != 2:
        raise ValueError(
            f"src_tokens: expected a (batch, length) tensor, got {tuple(src_tokens.shape)}"
        )
    if src_lengths.dim() != 1 or src_lengths.size(0) != src_tokens.size(0):
        raise ValueError(
            f"src_lengths: expected one length per sentence ({src_tokens.size(0)}), "
            f"got shape {tuple(src_lengths.shape)}"
        )
    if beam < 1:
        raise ValueError(f"beam: must be at least 1, got {beam}")
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest: must be between 1 and beam ({beam}), got {nbest}")
    if min_len < 0:
        raise ValueError(f"min_len: must be >= 0, got {min_len}")
    if lenpen != lenpen:  # NaN
        raise ValueError("lenpen: must be a number, got NaN")
    # +inf forbids <unk> (like pad); NaN or -inf would make every score NaN or +inf, and the
    # topk would then pick arbitrary tokens (EOS inside hypotheses, NaN scores)
    if unk_penalty != unk_penalty or unk_penalty == float("-inf"):
        raise ValueError(
            f"unk_penalty: must be a finite number (or inf, to forbid <unk>), got {unk_penalty}"
        )


def max_lengths(
    src_lengths: Sequence[int],
    max_len_a: float,
    max_len_b: int,
    max_positions: int | None,
    min_len: int,
    width: int,
) -> list[int]:
    """The last decoding step of each sentence, where EOS is forced.

    ``int(max_len_a * src_len + max_len_b)`` with src_len the sentence's own length (EOS
    included), capped at ``max_positions - 1`` (the decoder input at the last step holds the
    leading EOS as well). An output has at most that many tokens before its EOS.

    Args:
        src_lengths: each sentence's length, EOS included.
        max_len_a, max_len_b: the length rule.
        max_positions: the decoder's positions, None for no cap.
        min_len: the first step at which EOS is allowed; must not exceed any limit.
        width: the padded source width (to check the lengths against).
    """
    limits = []
    for i, n in enumerate(src_lengths):
        if not 1 <= n <= width:
            raise ValueError(
                f"src_lengths[{i}] = {n}: a source holds between 1 token (its EOS) and the "
                f"padded width {width}"
            )
        limit = int(max_len_a * n + max_len_b)
        if max_positions is not None:
            limit = min(limit, max_positions - 1)
        if limit < min_len:
            raise ValueError(
                f"sentence {i}: the maximum length {limit} (max_len_a * {n} + max_len_b, capped "
                f"by the model's positions) is below min_len {min_len}; raise max_len_b or "
                "lower min_len"
            )
        limits.append(limit)
    return limits


def index_tensor(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """(n,) long tensor of host ints on ``device``, queued without waiting for the device.

    A plain copy from pageable host memory to a CUDA device waits until the device's queue is
    empty; one from pinned memory is queued like a kernel and the host goes on (the caching
    host allocator keeps the pinned block until the copy is done).
    """
    if device.type == "cuda":
        pinned = torch.tensor(values, dtype=torch.long, pin_memory=True)
        return pinned.to(device, non_blocking=True)
    return torch.tensor(values, dtype=torch.long, device=device)


def length_normalise(score: float, length: int, lenpen: float, normalize: bool) -> float:
    """A finished hypothesis' score: the log-prob sum, over ``length ** lenpen`` if normalised."""
    return score / (length**lenpen) if normalize else score


# ---------------------------------------------------------------------------- timing


class SearchTimer(Protocol):
    """A hook a search calls around each phase; ``phase(name)`` returns a context manager."""

    def phase(self, name: str) -> AbstractContextManager: ...


_NO_PHASE = contextlib.nullcontext()  # reusable: entering it twice is allowed


def phase_of(timer: SearchTimer | None) -> Callable[[str], AbstractContextManager]:
    """The ``phase`` function to call: the timer's, or a free no-op (no host sync, no clock)."""
    if timer is None:
        return lambda name: _NO_PHASE
    return timer.phase


class PhaseTimer:
    """Wall time per phase, summed over calls.

    Args:
        synchronize: called before each clock reading; pass ``torch.cuda.synchronize`` on a
            GPU so queued kernels are charged to the phase that launched them (this costs a
            host sync per phase, which is why timing is off unless a timer is given).
        clock: the clock read (``time.process_time`` gives CPU time, steadier than wall time
            on a machine shared with other work).
    """

    def __init__(
        self,
        synchronize: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.synchronize = synchronize
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.synchronize is not None:
            self.synchronize()
        start = self.clock()
        try:
            yield
        finally:
            if self.synchronize is not None:
                self.synchronize()
            self.seconds[name] = self.seconds.get(name, 0.0) + self.clock() - start
            self.calls[name] = self.calls.get(name, 0) + 1

    def total(self, *names: str) -> float:
        """Seconds spent in the named phases (all phases if none is named)."""
        return sum(s for n, s in self.seconds.items() if not names or n in names)
