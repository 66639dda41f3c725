"""How every search runs: its settings, the argument checks, each sentence's length limit, and
`run_search`, the frame every search's own loop runs in; plus two helpers their steps share.

Nothing here chooses hypotheses: the tensorized search (`beam.py`), the reference search
(`reference.py`) and greedy decoding (`greedy.py`) each do that their own way, so that the tests
comparing them compare two independent implementations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from convseq.search.interface import Hypothesis, SearchModel, as_search_model


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
