"""Packing a split's pairs into batches, as fairseq does: order, filter, pack (steps 1-3 of the
pipeline in `convseq.data.batching`, whose `TokenBatchSampler` computes the list once and then
shuffles and shards it every epoch).

1. `ordered_indices`: a permutation seeded with `seed + 1` (fairseq's first epoch is 1), then
   stable mergesorts by target and then source length: sorted by (source, target) length, random
   within ties.
2. `filter_by_size`: pairs longer than `max_positions` (source or target, EOS included) are
   dropped and counted (train), or refused (valid/test, where a smaller set would inflate BLEU).
3. `batch_by_size`: greedy packing in that order, cost = batch size x longest `num_tokens`
   (`max(src_len, tgt_len)`), at most `max_tokens` and/or `max_sentences`, sizes kept to multiples
   of `required_batch_size_multiple` when the budget allows.

Departure from fairseq (since d871f616): fairseq drops a last batch whose size is not a multiple of
`required_batch_size_multiple`; here it is kept, so no pair is silently lost every epoch.
"""

from __future__ import annotations

import numpy as np

from convseq.errors import DataError

ORDERS = ("fairseq", "snake")


def ordered_indices(
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    seed: int | None = None,
    order: str = "fairseq",
) -> np.ndarray:
    """Indices sorted by (source length, target length); random within ties when `seed` is set.

    Args:
        src_sizes: (N,) source lengths. tgt_sizes: (N,) target lengths.
        seed: seed of the initial permutation (fairseq: `seed + epoch`); None = no permutation.
        order: "fairseq": target lengths ascending within each source length. "snake" (not in
            fairseq): the target direction alternates between consecutive source lengths, so a
            batch that straddles two source lengths finds similar target lengths on both sides
            instead of the longest next to the shortest (less target padding; see docs/data.md).

    Returns:
        (N,) int64 indices.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    n = len(src_sizes)
    if seed is None:
        idx = np.arange(n, dtype=np.int64)
    else:
        # RandomState(s).permutation(n) is what fairseq's numpy_seed(s) + np.random.permutation draw.
        idx = np.random.RandomState(seed).permutation(n).astype(np.int64)
    tgt_key = np.asarray(tgt_sizes, dtype=np.int64)
    if order == "snake":
        # rank of each source length among the distinct ones; odd ranks sort targets descending
        rank = np.searchsorted(np.unique(src_sizes), src_sizes)
        tgt_key = np.where(rank % 2 == 1, -tgt_key, tgt_key)
    idx = idx[np.argsort(tgt_key[idx], kind="mergesort")]  # stable: keeps the random order
    return idx[np.argsort(src_sizes[idx], kind="mergesort")]


def filter_by_size(
    indices: np.ndarray,
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    max_positions: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray]:
    """Split `indices` into (kept, dropped): dropped pairs have src > max_src or tgt > max_tgt."""
    too_long = (src_sizes[indices] > max_positions[0]) | (tgt_sizes[indices] > max_positions[1])
    return indices[~too_long], indices[too_long]


def batch_by_size(
    indices: np.ndarray,
    num_tokens: np.ndarray,
    max_tokens: int | None = None,
    max_sentences: int | None = None,
    required_batch_size_multiple: int = 1,
) -> list[np.ndarray]:
    """Pack `indices`, in order, into batches (fairseq's `batch_by_size`, HEAD semantics).

    A running batch is committed up to the last position where its size was below the multiple
    or a multiple of it; the uncommitted rest is its "tail". When adding the next pair would break
    a limit, the committed part becomes a batch and the tail starts the next one (if the tail
    alone breaks the token limit, it is cut before the new pair). Every batch therefore has
    `len(batch) * max(num_tokens[batch]) <= max_tokens` and `len(batch) <= max_sentences`.

    Args:
        indices: (N,) dataset indices in the order to pack them.
        num_tokens: (N,) `max(src_len, tgt_len)` of each entry of `indices` (aligned with it).
        max_tokens: padded-token budget per batch (None = no limit).
        max_sentences: sentences per batch (None = no limit).
        required_batch_size_multiple: keep batch sizes multiples of this when the budget allows.

    Returns:
        A list of int64 index arrays, in packing order.

    Raises:
        DataError: a single pair is longer than `max_tokens` (no batch could hold it).
    """
    indices = np.asarray(indices, dtype=np.int64)
    num_tokens = np.asarray(num_tokens, dtype=np.int64)
    if len(indices) != len(num_tokens):
        raise ValueError(f"{len(indices)} indices but {len(num_tokens)} lengths")
    if len(indices) == 0:
        return []
    if max_tokens is not None and max_tokens < 1 or max_sentences is not None and max_sentences < 1:
        raise ValueError(f"max_tokens={max_tokens}, max_sentences={max_sentences}: must be >= 1")
    mult = max(1, int(required_batch_size_multiple))
    longest = int(num_tokens.max())
    if max_tokens is not None and longest > max_tokens:
        raise DataError(
            f"batching.max_tokens={max_tokens} is smaller than the longest pair kept "
            f"({longest} tokens, EOS included): raise batching.max_tokens (or max_tokens_valid) "
            f"to at least {longest}, or lower max_positions so that longer pairs are filtered"
        )
    cap_tok = max_tokens or 0  # 0 = no limit, as in fairseq
    cap_sent = max_sentences or 0
    # A plain Python loop over a list: ~0.2 us per pair, done once per split (the list is frozen).
    lens = num_tokens.tolist()
    return np.split(indices, _batch_ends(lens, cap_tok, cap_sent, mult))


def _batch_ends(lens: list[int], cap_tok: int, cap_sent: int, mult: int) -> list[int]:
    """The exclusive end of each batch of `batch_by_size`'s packing of `lens` (pair lengths in
    packing order), the last one left out; a cap of 0 is no limit."""
    ends: list[int] = []  # exclusive ends of finished batches
    start = end = 0  # running batch = [start, end) committed + tail [end, pos]
    batch_max = tail_max = 0
    for pos, n in enumerate(lens):
        if n > tail_max:
            tail_max = n
        size = pos + 1 - start
        new_max = batch_max if batch_max > tail_max else tail_max
        if (cap_sent and size > cap_sent) or (cap_tok and size * new_max > cap_tok):
            ends.append(end)  # the committed part is a batch
            if cap_tok and tail_max * (pos + 1 - end) > cap_tok:
                ends.append(pos)  # the tail without the new pair is one too
                tail_max = n
            start = ends[-1]
            end, batch_max, tail_max = pos + 1, tail_max, 0
        elif size < mult or size % mult == 0:
            end, batch_max, tail_max = pos + 1, new_max, 0
    if end != len(lens):
        ends.append(end)  # the uncommitted tail is the last batch
    return ends
