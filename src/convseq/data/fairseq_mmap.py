"""Reading one side of a split from fairseq's memory-mapped indexed format (`--dataset-impl mmap`).

fairseq-preprocess writes, for a prefix `P` such as `databin/train.de-en.de`:

- `P.idx`: the 9-byte magic `MMIDIDX\\0\\0`, then little-endian uint64 version (1), uint8 dtype
  code, uint64 number of sentences n, int32 sizes[n] (tokens per sentence, EOS included) and
  int64 pointers[n] (byte offset of each sentence in `P.bin`): 26 + 12 n bytes in all;
- `P.bin`: every sentence's token ids, concatenated, in that dtype (uint16 below 65,500 symbols).

Both files are checked against each other as they are opened, and `P.bin` is memory-mapped:
nothing of it is read until a sentence is asked for (`FairseqTokenArray` is a `TokenArray`, so
the datasets and batching read it exactly as they read convseq's own data-bin).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from convseq.data.indexed import TokenArray
from convseq.errors import DataError

MMAP_MAGIC = b"MMIDIDX\x00\x00"
# fairseq's other binary format ("lazy" and "cached" read the same files): refused by name
TNT_MAGIC = b"TNTIDX\x00\x00"
HEADER_BYTES = len(MMAP_MAGIC) + 8 + 1 + 8
# fairseq's dtype codes; the float ones never hold token ids
DTYPE_CODES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    8: np.uint16,
    9: np.uint32,
    10: np.uint64,
}
RERUN = "re-run fairseq-preprocess --dataset-impl mmap"
SCAN_BLOCK = 1 << 24  # ids per block when the largest id is looked for (bounded memory)


def read_index(path: str | os.PathLike) -> tuple[np.dtype, np.ndarray, np.ndarray]:
    """(token dtype, sizes, pointers) of a fairseq `.idx` file, every field checked.

    Raises:
        DataError: another format, a damaged header or a length that disagrees with it.
    """
    path = str(path)
    raw = Path(path).read_bytes()  # 12 bytes a sentence: the index, never the tokens
    if raw.startswith(TNT_MAGIC):
        raise DataError(
            f"fairseq's 'lazy'/'cached' format (magic {TNT_MAGIC!r}) is not read by convseq: "
            f"{RERUN}",
            path=path,
        )
    if raw[: len(MMAP_MAGIC)] != MMAP_MAGIC:
        raise DataError(
            f"not a fairseq mmap index: starts with {raw[: len(MMAP_MAGIC)]!r}, not "
            f"{MMAP_MAGIC!r}; {RERUN}",
            path=path,
        )
    if len(raw) < HEADER_BYTES:
        raise DataError(
            f"truncated index: {len(raw)} bytes, header alone is 26; {RERUN}", path=path
        )
    at = len(MMAP_MAGIC)
    version = int(np.frombuffer(raw, "<u8", 1, at)[0])
    code = raw[at + 8]
    n = int(np.frombuffer(raw, "<u8", 1, at + 9)[0])
    if version != 1:
        raise DataError(f"index version {version}, convseq reads version 1; {RERUN}", path=path)
    if code not in DTYPE_CODES:
        raise DataError(f"dtype code {code} is not an integer type; {RERUN}", path=path)
    if len(raw) != HEADER_BYTES + 12 * n:
        raise DataError(
            f"index is {len(raw)} bytes but its header announces {n} sentences "
            f"({HEADER_BYTES + 12 * n} bytes): truncated or damaged; {RERUN}",
            path=path,
        )
    sizes = np.frombuffer(raw, "<i4", n, HEADER_BYTES).astype(np.int64)
    pointers = np.frombuffer(raw, "<i8", n, HEADER_BYTES + 4 * n)
    return np.dtype(DTYPE_CODES[code]).newbyteorder("<"), sizes, pointers


class FairseqTokenArray(TokenArray):
    """One side of a split in fairseq's mmap format, read like convseq's own `TokenArray`.

    Args:
        prefix: the path without `.bin` / `.idx`, e.g. `databin/valid.de-en.en`.

    Raises:
        DataError: a missing or damaged file, or sizes, pointers and `.bin` length that disagree.
    """

    def __init__(self, prefix: str | os.PathLike):  # noqa: D107  (the parent's reading is not used)
        self.prefix = str(prefix)
        idx, bin_ = self.prefix + ".idx", self.prefix + ".bin"
        for f in (idx, bin_):
            if not Path(f).is_file():
                raise DataError(
                    f"missing: a fairseq split needs its .bin and .idx; {RERUN}", path=f
                )
        dtype, sizes, pointers = read_index(idx)
        if len(sizes) and int(sizes.min()) < 1:
            i = int(np.argmin(sizes))
            raise DataError(
                f"sentence {i} has {int(sizes[i])} tokens; fairseq-preprocess ends every "
                f"sentence with EOS (>= 1): damaged index; {RERUN}",
                path=idx,
            )
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        if not np.array_equal(pointers, offsets[:-1] * dtype.itemsize):
            i = int(np.argmax(pointers != offsets[:-1] * dtype.itemsize))
            raise DataError(
                f"pointer of sentence {i} is byte {int(pointers[i])} but the sizes before it "
                f"add up to byte {int(offsets[i]) * dtype.itemsize}: damaged index; {RERUN}",
                path=idx,
            )
        want = int(offsets[-1]) * dtype.itemsize
        have = Path(bin_).stat().st_size
        if have != want:
            raise DataError(
                f"holds {have} bytes but {Path(idx).name} announces {int(offsets[-1])} tokens "
                f"of {dtype.itemsize} bytes ({want} bytes): "
                f"{'truncated' if have < want else 'too long'}; {RERUN}",
                path=bin_,
            )
        # np.memmap cannot map an empty file; an empty split has no tokens to map
        self.tokens = np.memmap(bin_, dtype=dtype, mode="r") if want else np.zeros(0, dtype)
        self.offsets = offsets
        self.sizes = sizes

    @property
    def _off(self) -> str:
        return self.prefix + ".idx"

    def max_id(self) -> int:
        """The largest token id (-1 when empty), scanned block by block through the map."""
        top = -1
        for start in range(0, len(self.tokens), SCAN_BLOCK):
            top = max(top, int(self.tokens[start : start + SCAN_BLOCK].max()))
        return top
