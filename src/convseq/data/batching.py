"""Token-budget batching as fairseq does it, and a batch sampler that shards it over DDP ranks.

The pipeline (fairseq's `get_batch_iterator` + `EpochBatchIterator` + `ShardedIterator`):

1. `ordered_indices`: sorted by (source, target) length, random within ties;
2. `filter_by_size`: pairs longer than `max_positions` dropped (train) or refused (valid/test);
3. `batch_by_size`: greedy packing in that order under `max_tokens` and/or `max_sentences`.
   Steps 1-3 are in `convseq.data.packing`, which details them; the list is computed once
   (frozen).
4. Each epoch the list of batches is shuffled with `seed + epoch + 1` (0-based `epoch`, i.e.
   fairseq's `seed + epoch` with its 1-based epochs), identically on every rank; rank `r` takes
   `batches[r::world]` and the ranks that come up one short get a padding ("dummy") batch, so that
   every rank runs the same number of steps (a rank with fewer steps hangs DDP).

Dummy batches repeat real sentences; their indices are encoded as `-1 - i` (`dummy_index`), so the
flag survives the trip through DataLoader worker processes and Lightning's batch-sampler wrappers;
`LanguagePairDataset` decodes it and its collate reports `is_dummy=True, nsentences=0, ntokens=0`.

`batching=sentences` with `match_max_tokens` (fixed-sentence batches at a matched mean batch size):
`max_sentences = ceil(N / B)`, where N is the number of train pairs kept after filtering and B the
number of batches that token-budget batching with `max_tokens = match_max_tokens` (same ordering,
filtering and `required_batch_size_multiple`) makes on them. Fixed-sentence batching then makes
`ceil(N / max_sentences) <= B` batches, i.e. the same mean batch size up to rounding and the same
number of updates per epoch (see `match_max_sentences`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

from convseq.data.packing import batch_by_size, filter_by_size, ordered_indices
from convseq.errors import DataError


def dummy_index(i: int) -> int:
    """The encoded form of index `i` inside a dummy (rank-evening) batch."""
    return -1 - i


def decode_index(i: int) -> tuple[int, bool]:
    """(dataset index, whether it comes from a dummy batch) of a sampler index."""
    return (-1 - i, True) if i < 0 else (i, False)


def match_max_sentences(
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    match_max_tokens: int,
    max_positions: tuple[int, int] = (1022, 1022),
    required_batch_size_multiple: int = 1,
    seed: int = 1,
    order: str = "fairseq",
) -> int:
    """`max_sentences` whose fixed-sentence batches match the mean batch size of a token budget.

    The rule (module docstring): `ceil(N / B)`, B = number of token-budget batches with
    `max_tokens = match_max_tokens` on the N pairs kept by the `max_positions` filter.
    """
    ordered = ordered_indices(src_sizes, tgt_sizes, seed + 1, order)
    kept, _ = filter_by_size(ordered, src_sizes, tgt_sizes, max_positions)
    if len(kept) == 0:
        raise DataError("no training pair is within max_positions; nothing to batch")
    num_tokens = np.maximum(src_sizes[kept], tgt_sizes[kept])
    batches = batch_by_size(kept, num_tokens, match_max_tokens, None, required_batch_size_multiple)
    return math.ceil(len(kept) / len(batches))


def _empty_epoch(
    name: str, pairs: int, filtered: int, max_positions: tuple[int, int], source: str | None
) -> str:
    """Why a split has no batch: its pair count, how many were filtered and why, and its files."""
    where = f" ({source})" if source else ""
    why, fix = "the split holds no pair", "rebuild the data-bin from files that hold pairs"
    if pairs:
        why = f"all {filtered} of its {pairs} pairs are longer (EOS included) and were filtered"
        fix = "raise the model's max positions, or shorten the sentences"
    return (
        f"{name}{where}: no pair is within max_positions {max_positions}: {why}; "
        f"the epoch would be empty: {fix}"
    )


def _check_arguments(
    name: str,
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    max_tokens: int | None,
    max_sentences: int | None,
    rank: int,
    world_size: int,
    overlong: str,
) -> None:
    """Refuse sizes of another shape than (N,) on both sides, no budget, a rank outside the
    world, or an unknown `overlong`."""
    if src_sizes.shape != tgt_sizes.shape or src_sizes.ndim != 1:
        raise ValueError(f"{name}: {src_sizes.shape} source sizes, {tgt_sizes.shape} target")
    if max_tokens is None and max_sentences is None:
        raise DataError("set batching.max_tokens or batching.max_sentences (both are null)")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    if overlong not in ("skip", "error"):
        raise ValueError(f"overlong must be 'skip' or 'error', got {overlong!r}")


def _overlong(
    name: str,
    dropped: np.ndarray,
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    max_positions: tuple[int, int],
) -> str:
    """Why a valid/test split with pairs over `max_positions` is refused, naming the first."""
    first = int(np.sort(dropped)[0])
    return (
        f"{name}: {len(dropped)} pair(s) are longer than max_positions {max_positions} "
        f"(e.g. pair {first}: {src_sizes[first]} source / {tgt_sizes[first]} target "
        "tokens incl. EOS); nothing is dropped from valid/test silently: shorten them, "
        "raise the model's max positions, or set data.eval_overlong=skip"
    )


def _check_longest(name: str, num_tokens: np.ndarray, max_tokens: int | None) -> None:
    """Refuse a token budget smaller than the longest pair kept, naming the split's key."""
    longest = int(num_tokens.max())
    if max_tokens is not None and longest > max_tokens:
        key = "max_tokens" if name == "train" else "max_tokens_valid (or max_tokens)"
        raise DataError(
            f"{name}: batching.{key}={max_tokens} is smaller than the longest pair kept "
            f"({longest} tokens, EOS included), which no batch could hold: raise it to at "
            f"least {longest}, or lower max_positions so that longer pairs are filtered"
        )


class TokenBatchSampler(Sampler[list[int]]):
    """Frozen, per-epoch reshuffled, DDP-sharded batches of dataset indices (see module docstring).

    It yields lists of indices; indices of dummy batches are encoded with `dummy_index`. Its
    length is the same every epoch and on every rank: `ceil(num_batches / world_size)`.

    Resuming: `state_dict()` holds the epoch and the number of batches of it already consumed;
    `advance()` marks one more batch consumed (`BatchEpochCallback` calls it after each training
    batch; counting what was *trained on* rather than what was yielded keeps the count right
    when DataLoader workers prefetch). After `load_state_dict`, iteration starts at the next batch.

    Args:
        src_sizes: (N,) source lengths, EOS included. tgt_sizes: (N,) target lengths.
        max_tokens: padded-token budget per batch (None = no limit).
        max_sentences: sentences per batch (None = no limit). One of the two is required.
        required_batch_size_multiple: fairseq's --required-batch-size-multiple.
        max_positions: (max source, max target) length kept, EOS included.
        shuffle: seeded initial permutation and per-epoch batch shuffle (train); False keeps the
            sorted order (valid/test).
        seed: fairseq's --seed.
        rank, world_size: this process's share of the batches.
        overlong: "skip" drops pairs over max_positions and counts them; "error" refuses them.
        name: the split's name, for messages.
        order: "fairseq" (default) or "snake" (see `ordered_indices`).
        source: where the split's pairs come from (its data-bin files and input files), for
            the message when no pair is left.
    """

    def __init__(
        self,
        src_sizes: Sequence[int] | np.ndarray,
        tgt_sizes: Sequence[int] | np.ndarray,
        *,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
        required_batch_size_multiple: int = 1,
        max_positions: tuple[int, int] = (1022, 1022),
        shuffle: bool = True,
        seed: int = 1,
        rank: int = 0,
        world_size: int = 1,
        overlong: str = "skip",
        name: str = "train",
        order: str = "fairseq",
        source: str | None = None,
    ):
        src_sizes = np.asarray(src_sizes, dtype=np.int64)
        tgt_sizes = np.asarray(tgt_sizes, dtype=np.int64)
        _check_arguments(
            name, src_sizes, tgt_sizes, max_tokens, max_sentences, rank, world_size, overlong
        )
        self.name = name
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences

        self.order = order
        ordered = ordered_indices(src_sizes, tgt_sizes, seed + 1 if shuffle else None, order)
        kept, dropped = filter_by_size(ordered, src_sizes, tgt_sizes, max_positions)
        if len(dropped) and overlong == "error":
            raise DataError(_overlong(name, dropped, src_sizes, tgt_sizes, max_positions))
        if len(kept) == 0:
            raise DataError(_empty_epoch(name, len(src_sizes), len(dropped), max_positions, source))
        self.filtered_indices = np.sort(dropped)  # dataset indices dropped as over-long
        self.num_filtered = len(dropped)
        self.num_kept = len(kept)
        num_tokens = np.maximum(src_sizes[kept], tgt_sizes[kept])
        _check_longest(name, num_tokens, max_tokens)
        # Frozen once: per-epoch work is only a permutation of this list.
        self.batches: list[np.ndarray] = batch_by_size(
            kept, num_tokens, max_tokens, max_sentences, required_batch_size_multiple
        )
        self.epoch = 0
        self.offset = 0  # batches of `epoch` already consumed on this rank

    # -- epochs and sharding --------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the (0-based) epoch whose order is iterated; a new epoch starts at its first batch."""
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self.offset = 0

    def epoch_order(self, epoch: int) -> np.ndarray:
        """(num_batches,) the order of the frozen batches in `epoch`, the same on every rank."""
        nb = len(self.batches)
        if not self.shuffle:
            return np.arange(nb)
        return np.random.RandomState(self.seed + epoch + 1).permutation(nb)

    def rank_batches(self, epoch: int | None = None) -> list[tuple[np.ndarray, bool]]:
        """This rank's (indices, is_dummy) batches of `epoch` (default: the current one)."""
        order = self.epoch_order(self.epoch if epoch is None else epoch)
        mine = [(self.batches[b], False) for b in order[self.rank :: self.world_size]]
        # Dummies repeat this rank's first batch (or the epoch's first): a size every rank can hold.
        filler = mine[0][0] if mine else self.batches[order[0]]
        mine += [(filler, True)] * (len(self) - len(mine))
        return mine

    def __len__(self) -> int:
        return -(-len(self.batches) // self.world_size)

    def __iter__(self) -> Iterator[list[int]]:
        start = self.offset
        for indices, is_dummy in self.rank_batches()[start:]:
            ids = indices.tolist()
            yield [-1 - i for i in ids] if is_dummy else ids

    # -- resuming -------------------------------------------------------------------------------
    def advance(self, n: int = 1) -> None:
        """Mark `n` more batches of the current epoch as consumed (trained on)."""
        self.offset += n

    def state_dict(self) -> dict:
        """Position to resume from: epoch, batches consumed, and what they were counted against."""
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "num_batches": len(self),
            "world_size": self.world_size,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume at the batch after the last consumed one (a finished epoch moves to the next)."""
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        saved = (state.get("num_batches"), state.get("world_size"), state.get("seed"))
        if saved != (len(self), self.world_size, self.seed):
            warnings.warn(
                f"{self.name}: the batches changed since this state was saved (batches per rank, "
                f"world size, seed: {saved} then, {(len(self), self.world_size, self.seed)} now); "
                f"epoch {self.epoch} restarts at its first batch",
                stacklevel=2,
            )
            self.offset = 0
        elif self.offset >= len(self):
            self.epoch, self.offset = self.epoch + 1, 0

    def __repr__(self) -> str:
        return (
            f"TokenBatchSampler({self.name}: {self.num_kept} pairs in {len(self.batches)} batches, "
            f"{len(self)} per rank x {self.world_size}, filtered {self.num_filtered}, "
            f"max_tokens={self.max_tokens}, max_sentences={self.max_sentences})"
        )


def source_batches(
    src_sizes: Sequence[int] | np.ndarray,
    max_tokens: int | None,
    max_sentences: int | None,
    max_positions: int,
    name: str,
) -> list[list[int]]:
    """Batches of sentence ids for translating sources alone, as fairseq-generate makes them:
    sorted by length, packed under `max_tokens` (padding counted) and/or `max_sentences`, never
    shuffled. A source longer than `max_positions` (EOS included) is refused, naming `name`.

    Raises:
        DataError: both budgets are None, or a source is longer than `max_positions`.
    """
    sizes = np.asarray(src_sizes, dtype=np.int64)
    sampler = TokenBatchSampler(
        sizes,
        np.zeros_like(sizes),
        max_tokens=max_tokens,
        max_sentences=max_sentences,
        shuffle=False,
        max_positions=(max(int(max_positions), 1), 1 << 30),
        overlong="error",
        name=name,
    )
    return list(sampler)
