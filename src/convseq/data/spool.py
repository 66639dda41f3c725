"""The provisional token ids of a split, spooled to disk between segmentation and binarisation.

Segmentation comes before the dictionaries (they count the train tokens), so each kept sentence's
provisional ids (`convseq.data.encode`) are appended to raw files in a spool folder inside the
data-bin being built: memory holds one block, never the corpus. Once the dictionaries exist,
`write_side` streams a side back through a lookup table into the final `.tokens.npy` /
`.offsets.npy` pair, and `write_lines` the kept line numbers into `.lines.npy`.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from convseq.data.indexed import NpyWriter

ID_DTYPE = np.int32  # provisional ids and sentence lengths
SIDES = ("src", "tgt")
READ_SENTENCES = 50_000  # sentences read back per step: ~1M ids, ~10 MB of temporaries


class SplitSpool:
    """Raw files of one split: kept line numbers, and per side provisional ids and lengths."""

    def __init__(self, folder: Path, split: str):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        names = ["lines"] + [f"{side}.{kind}" for side in SIDES for kind in ("ids", "len")]
        self.paths = {name: folder / f"{split}.{name}" for name in names}
        self._files = {name: open(path, "wb") for name, path in self.paths.items()}
        self.sentences = 0
        self.tokens = dict.fromkeys(SIDES, 0)  # without EOS
        self.max_len = dict.fromkeys(SIDES, 0)  # without EOS

    def append(self, lines: np.ndarray, sides: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """Append pairs: their 0-based input lines and, per side, (ids, lengths)."""
        self._files["lines"].write(np.ascontiguousarray(lines, dtype=np.int64).data)
        for side, (ids, lengths) in sides.items():
            self._files[f"{side}.ids"].write(np.ascontiguousarray(ids, dtype=ID_DTYPE).data)
            self._files[f"{side}.len"].write(np.ascontiguousarray(lengths, dtype=ID_DTYPE).data)
            self.tokens[side] += len(ids)
            if len(lengths):
                self.max_len[side] = max(self.max_len[side], int(lengths.max()))
        self.sentences += len(lines)

    def close(self) -> None:
        for f in self._files.values():
            f.close()

    def side_blocks(self, side: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids, lengths) of a side, `READ_SENTENCES` sentences at a time, in order."""
        with (
            open(self.paths[f"{side}.ids"], "rb") as ids_file,
            open(self.paths[f"{side}.len"], "rb") as len_file,
        ):
            for start in range(0, self.sentences, READ_SENTENCES):
                n = min(READ_SENTENCES, self.sentences - start)
                lengths = np.fromfile(len_file, dtype=ID_DTYPE, count=n)
                ids = np.fromfile(ids_file, dtype=ID_DTYPE, count=int(lengths.sum()))
                yield ids, lengths

    def line_blocks(self) -> Iterator[np.ndarray]:
        with open(self.paths["lines"], "rb") as f:
            for start in range(0, self.sentences, READ_SENTENCES):
                n = min(READ_SENTENCES, self.sentences - start)
                yield np.fromfile(f, dtype=np.int64, count=n)


def write_side(
    prefix: Path,
    spool: SplitSpool,
    side: str,
    lut: np.ndarray,
    eos: int,
    unk: int,
    desc: str,
    show: bool,
) -> dict:
    """Write a side's `.tokens.npy` and `.offsets.npy` (ids through `lut`, EOS appended).

    Returns its counts for meta.json. The files hold the bytes that `indexed.write_split` writes
    for the same sentences.
    """
    n = spool.sentences
    n_tok = spool.tokens[side] + n  # EOS included, as fairseq-preprocess counts them
    n_unk = 0
    end = 0
    with (
        NpyWriter(str(prefix) + ".tokens.npy", lut.dtype, n_tok) as tokens,
        NpyWriter(str(prefix) + ".offsets.npy", np.int64, n + 1) as offsets,
        tqdm(total=n, desc=f"binarise {desc}", unit="line", disable=not show) as bar,
    ):
        offsets.write(np.zeros(1, dtype=np.int64))
        for ids, lengths in spool.side_blocks(side):
            mapped = lut[ids]
            n_unk += int(np.count_nonzero(mapped == unk))
            # One EOS after each sentence: a flag per output token (1 byte, where index arrays
            # would take 16) tells the ids' places from the EOS places.
            local_ends = np.cumsum(lengths + 1, dtype=np.int64)
            out = np.empty(len(ids) + len(lengths), dtype=lut.dtype)
            is_id = np.ones(len(out), dtype=bool)
            is_id[local_ends - 1] = False
            out[is_id] = mapped
            out[local_ends - 1] = eos
            tokens.write(out)
            offsets.write(end + local_ends)
            end += len(out)
            bar.update(len(lengths))
    return {
        "tokens": n_tok,
        "unk": n_unk,
        "unk_rate": n_unk / n_tok if n_tok else 0.0,
        "max_len": spool.max_len[side] + 1 if n else 0,
    }


def write_lines(path: Path, spool: SplitSpool) -> None:
    """Write the kept sentences' 0-based input lines as `.lines.npy`."""
    with NpyWriter(path, np.int64, spool.sentences) as out:
        for block in spool.line_blocks():
            out.write(block)


def remove_spool(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
