"""Segmenting blocks of sentence pairs into provisional token ids, in this process or in several.

Preprocessing segments every sentence once, before the dictionaries exist (they count the train
tokens), so a sentence's tokens are kept as *provisional* ids, small integers that a per-language
`SymbolTable` maps back to token strings; once the dictionaries are built, one lookup table per
language turns provisional ids into dictionary ids for a whole array at a time.

`encode_block` does the work for one block of lines. With sentencepiece, provisional ids are the
model's piece ids (integers straight from its C++ encoder: no Python string per token), except
where the model emits its unknown piece: there the surface text of the piece is kept as an extra
symbol, because the dictionary counts and looks up what `encode(out_type=str)` gives, i.e. that
text. Whitespace tokens are numbered per block in order of first appearance.

`BlockEncoder` runs `encode_block` over a stream of blocks, inline or in worker processes, and
always returns the results in input order: the output never depends on the number of workers.
`segment_split` drives it over a split: filters by length, counts, spools.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from itertools import chain, compress
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from convseq.data.spool import ID_DTYPE, SIDES, SplitSpool
from convseq.data.subword import Segmenter
from convseq.data.textio import PairFilter
from convseq.errors import DataError

# Set to the builder's pid in the environment of its worker processes: a worker that starts
# preprocessing itself (a script without a main guard, which `spawn` imports again) fails at once
# instead of waiting forever for the lock its parent holds.
WORKER_ENV = "CONVSEQ_PREPROCESS_WORKER"


@dataclass
class Encoded:
    """The tokens of a block of lines as provisional ids.

    `ids` holds every sentence's ids, concatenated (no EOS), `lengths` the token count of each
    sentence. Ids below `base` are the segmenter's own piece ids; id `base + k` is `extra[k]`.
    """

    ids: np.ndarray
    lengths: np.ndarray
    base: int
    extra: list[str]


def encode_block(seg: Segmenter, lines: Sequence[str], num_threads: int = 1) -> Encoded:
    """The provisional ids of `lines` (stripped), as `seg.segment_many` would tokenize them."""
    if seg.model is None:
        tokens = [ln.split() for ln in lines]
        lengths = np.fromiter(map(len, tokens), dtype=ID_DTYPE, count=len(tokens))
        flat = list(chain.from_iterable(tokens))
        # dict.fromkeys and map(index.__getitem__) keep the per-token loop in C.
        extra = list(dict.fromkeys(flat))
        index = {sym: i for i, sym in enumerate(extra)}
        ids = np.fromiter(map(index.__getitem__, flat), dtype=ID_DTYPE, count=len(flat))
        return Encoded(ids, lengths, 0, extra)
    model = seg.model
    rows = model.encode(list(lines), out_type=int, num_threads=num_threads)
    lengths = np.fromiter(map(len, rows), dtype=ID_DTYPE, count=len(rows))
    ids = np.fromiter(chain.from_iterable(rows), dtype=ID_DTYPE, count=int(lengths.sum()))
    base = model.get_piece_size()
    extra: list[str] = []
    unk_at = np.flatnonzero(ids == model.unk_id())
    if len(unk_at):
        # Rare (characters the model never saw): re-segment those sentences as strings.
        starts = np.concatenate(([0], np.cumsum(lengths)))
        index: dict[str, int] = {}
        for row in np.unique(np.searchsorted(starts, unk_at, side="right") - 1):
            pieces = model.encode(lines[row], out_type=str)
            start = int(starts[row])
            for j, piece_id in enumerate(rows[row]):
                if piece_id == model.unk_id():
                    k = index.setdefault(pieces[j], len(index))
                    ids[start + j] = base + k
        extra = list(index)
    return Encoded(ids, lengths, base, extra)


class SymbolTable:
    """The token strings behind one language's provisional ids, and their train counts.

    Global ids are the segmenter's piece ids first (`pieces`), then every other symbol in order of
    first appearance. Memory grows with the number of distinct symbols, never with the corpus.
    """

    def __init__(self, pieces: Sequence[str] = ()):
        self.symbols: list[str] = list(pieces)
        self.index: dict[str, int] = {s: i for i, s in enumerate(self.symbols)}
        self.counts = np.zeros(max(len(self.symbols), 1024), dtype=np.int64)

    def globalize(self, enc: Encoded) -> np.ndarray:
        """The global ids of a block's provisional ids (new symbols are added)."""
        lut = np.fromiter((self._add(s) for s in enc.extra), dtype=ID_DTYPE, count=len(enc.extra))
        if enc.base == 0:
            return lut[enc.ids]
        ids = enc.ids.copy()
        beyond = ids >= enc.base
        if beyond.any():
            ids[beyond] = lut[ids[beyond] - enc.base]
        return ids

    def _add(self, sym: str) -> int:
        i = self.index.get(sym)
        if i is None:
            i = self.index[sym] = len(self.symbols)
            self.symbols.append(sym)
        return i

    def count(self, ids: np.ndarray) -> None:
        """Add one occurrence of each id (train tokens: the dictionary's counts)."""
        if len(self.symbols) > len(self.counts):
            grown = np.zeros(2 * len(self.symbols), dtype=np.int64)
            grown[: len(self.counts)] = self.counts
            self.counts = grown
        if len(ids):
            found = np.bincount(ids, minlength=len(self.symbols))
            self.counts[: len(found)] += found

    def counted(self) -> dict[str, int]:
        """Every symbol seen in the counted tokens, with its count."""
        return {self.symbols[i]: int(self.counts[i]) for i in np.flatnonzero(self.counts)}

    def lookup_table(self, indices: dict[str, int], unk: int, dtype: np.dtype) -> np.ndarray:
        """Global id -> dictionary id (`unk` for a symbol the dictionary lacks)."""
        get = indices.get
        return np.fromiter(
            (get(s, unk) for s in self.symbols), dtype=dtype, count=len(self.symbols)
        )


def segment_split(
    pairs: Iterable[tuple[int, list[str], list[str]]],
    mask: np.ndarray,
    pair_filter: PairFilter,
    paths: tuple[Path, Path],
    encoder: BlockEncoder,
    tables: tuple[SymbolTable, SymbolTable],
    spool: SplitSpool,
    count: bool,
    text_paths: tuple[Path, Path] | None = None,
    desc: str = "",
    show: bool = False,
) -> None:
    """Segment a split's pairs whose `mask` flag is set, block by block, into `spool`.

    `pairs` are (first line, source lines, target lines) blocks (`textio.iter_pairs`). Over-long
    pairs are dropped or an error, by `pair_filter`'s policy; with `count`, the kept tokens are
    counted in `tables` (train); with `text_paths`, the kept lines' text is written there (the
    valid/test references).
    """
    text_files = [open(p, "w", encoding="utf-8", newline="\n") for p in text_paths or ()]

    def blocks() -> Iterator[tuple]:
        for first, s, t in pairs:
            keep = mask[first : first + len(s)]
            if not keep.all():
                flags = keep.tolist()
                s, t = list(compress(s, flags)), list(compress(t, flags))
            # The text rides along only when it is written (valid/test references).
            yield (
                (first + np.flatnonzero(keep), s if text_files else (), t if text_files else ()),
                s,
                t,
            )

    try:
        with tqdm(total=int(mask.sum()), desc=desc, unit="line", disable=not show) as bar:
            for (lines, s_text, t_text), *encoded in encoder.map(blocks()):
                keep = pair_filter.length_mask(
                    lines, encoded[0].lengths, encoded[1].lengths, *paths
                )
                sides = {}
                for side, table, enc in zip(SIDES, tables, encoded):
                    ids, lengths = table.globalize(enc), enc.lengths
                    if not keep.all():
                        ids, lengths = ids[np.repeat(keep, lengths)], lengths[keep]
                    if count:
                        table.count(ids)
                    sides[side] = (ids, lengths)
                spool.append(lines[keep], sides)
                for text_file, text in zip(text_files, (s_text, t_text)):
                    text_file.write("".join(ln + "\n" for ln in compress(text, keep.tolist())))
                bar.update(len(lines))
    finally:
        spool.close()
        for text_file in text_files:
            text_file.close()


# -- running blocks in worker processes ---------------------------------------------------------
_WORKER_SEGMENTERS: tuple[Segmenter, Segmenter] | None = None


def _init_worker(segmenters: tuple[Segmenter, Segmenter]) -> None:
    global _WORKER_SEGMENTERS
    _WORKER_SEGMENTERS = segmenters


def _encode_pair(block: tuple[list[str], list[str]], num_threads: int) -> tuple[Encoded, Encoded]:
    assert _WORKER_SEGMENTERS is not None
    src_seg, tgt_seg = _WORKER_SEGMENTERS
    return encode_block(src_seg, block[0], num_threads), encode_block(
        tgt_seg, block[1], num_threads
    )


class BlockEncoder:
    """Encodes blocks of (source lines, target lines), in order, with `workers` processes.

    `workers == 1` encodes in this process (sentencepiece uses `threads` threads). More workers
    each encode whole blocks with one thread; at most `2 * workers` blocks are in flight, so
    memory stays bounded whatever the corpus size. Workers are started with `spawn`: safe beside
    threads in this process (a Trainer, a DataLoader) and the same on every platform; like every
    spawned process they import the main script again, so a script that preprocesses with
    several workers must keep its code under `if __name__ == "__main__":`.
    Use as a context manager; the processes end with the block.
    """

    def __init__(self, src_seg: Segmenter, tgt_seg: Segmenter, workers: int = 1, threads: int = 2):
        self.segs = (src_seg, tgt_seg)
        self.workers = workers
        self.threads = threads
        self._pool: ProcessPoolExecutor | None = None
        self._saved_env: str | None = None

    def __enter__(self) -> BlockEncoder:
        if self.workers > 1:
            self._saved_env = os.environ.get(WORKER_ENV)
            # Inherited by the workers (started on demand): they see their parent's pid there.
            os.environ[WORKER_ENV] = str(os.getpid())
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(self.segs,),
            )
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            if self._saved_env is None:
                os.environ.pop(WORKER_ENV, None)
            else:
                os.environ[WORKER_ENV] = self._saved_env

    def map(self, blocks: Iterable[tuple[object, list[str], list[str]]]) -> Iterator[tuple]:
        """(tag, src lines, tgt lines) -> (tag, src Encoded, tgt Encoded), in input order."""
        if self._pool is None:
            src_seg, tgt_seg = self.segs
            for tag, src, tgt in blocks:
                yield (
                    tag,
                    encode_block(src_seg, src, self.threads),
                    encode_block(tgt_seg, tgt, self.threads),
                )
            return
        try:
            yield from self._map_pool(blocks)
        except BrokenProcessPool as e:
            raise DataError(
                f"a preprocessing worker process died ({e}); if the script that starts "
                "preprocessing has no `if __name__ == '__main__':` guard, add one (worker "
                "processes import it again), or set data.workers=1"
            ) from e

    def _map_pool(self, blocks: Iterable[tuple[object, list[str], list[str]]]) -> Iterator[tuple]:
        assert self._pool is not None
        pending: deque[tuple[object, Future]] = deque()
        for tag, src, tgt in blocks:
            pending.append((tag, self._pool.submit(_encode_pair, (src, tgt), 1)))
            if len(pending) >= 2 * self.workers:
                done_tag, future = pending.popleft()
                yield (done_tag, *future.result())
        while pending:
            done_tag, future = pending.popleft()
            yield (done_tag, *future.result())
