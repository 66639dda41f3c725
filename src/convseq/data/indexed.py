"""Binarised splits: one flat memory-mapped token array plus sentence offsets, per split and side.

On disk, for a prefix `P` (e.g. `databin/train.de`):
- `P.tokens.npy`: every sentence's token ids, EOS included, concatenated (uint16 when the
  vocabulary fits, else int32: half the bytes to page in for most vocabularies);
- `P.offsets.npy`: int64, length n + 1; sentence i is `tokens[offsets[i]:offsets[i + 1]]`.

Both are `.npy` files, so dtype and shape are in their headers and a truncated file is detected
when it is opened. They are memory-mapped: nothing is read until a sentence is asked for.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from convseq.errors import DataError


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of the vocabulary."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


def write_split(prefix: str | os.PathLike, sentences: Iterable[np.ndarray], vocab_size: int) -> int:
    """Write sentences (id arrays, EOS included) to `prefix.tokens.npy` / `prefix.offsets.npy`.

    Returns the number of sentences. Files are written under temporary names and renamed, so a
    crash never leaves a file that looks complete.
    """
    prefix = str(prefix)
    dtype = token_dtype(vocab_size)
    chunks: list[np.ndarray] = []
    lengths: list[int] = []
    for ids in sentences:
        chunks.append(np.asarray(ids, dtype=dtype))
        lengths.append(len(ids))
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    for suffix, array in ((".tokens.npy", tokens), (".offsets.npy", offsets)):
        tmp = prefix + suffix + ".tmp"
        with open(tmp, "wb") as f:
            np.save(f, array)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, prefix + suffix)
    return len(lengths)


class NpyWriter:
    """Write a 1-d `.npy` file of a known length piece by piece, in bounded memory.

    The bytes are those `np.save` writes for the whole array (the header gives the length, so it
    is written first). The file is written under a temporary name and renamed by `close`, so a
    crash never leaves a file that looks complete; leaving a `with` block on an error removes it.
    """

    def __init__(self, path: str | os.PathLike, dtype: np.dtype | type, length: int):
        self.path = str(path)
        self.dtype = np.dtype(dtype)
        self.length = length
        self.written = 0
        self._tmp = self.path + ".tmp"
        self._f = open(self._tmp, "wb")
        header = {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "fortran_order": False,
            "shape": (length,),
        }
        np.lib.format.write_array_header_1_0(self._f, header)

    def write(self, values: np.ndarray) -> None:
        """Append values (converted to the file's dtype)."""
        values = np.ascontiguousarray(values, dtype=self.dtype)
        if self.written + len(values) > self.length:
            raise ValueError(f"{self.path}: more than the {self.length} values announced")
        self._f.write(values.data)
        self.written += len(values)

    def close(self) -> None:
        """Check the length, flush to disk and rename into place."""
        if self.written != self.length:
            raise ValueError(f"{self.path}: {self.written} values written, {self.length} announced")
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self._tmp, self.path)

    def __enter__(self) -> NpyWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._f.close()
            Path(self._tmp).unlink(missing_ok=True)


class TokenArray:
    """Read-only, memory-mapped view of a binarised split (see the module docstring)."""

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = str(prefix)
        self.tokens = _load(self.prefix + ".tokens.npy")
        self.offsets = _load(self.prefix + ".offsets.npy")
        if self.offsets.ndim != 1 or len(self.offsets) == 0 or self.offsets[0] != 0:
            raise DataError("offsets array is malformed; re-run preprocessing", path=self._off)
        if int(self.offsets[-1]) != len(self.tokens):
            raise DataError(
                f"offsets end at {int(self.offsets[-1])} but the token array holds "
                f"{len(self.tokens)} tokens: the data-bin is damaged; delete it and re-run "
                "preprocessing",
                path=self.prefix + ".tokens.npy",
            )
        # (n,) lengths including EOS: the batching code never touches the tokens themselves.
        self.sizes = np.diff(self.offsets).astype(np.int64)

    @property
    def _off(self) -> str:
        return self.prefix + ".offsets.npy"

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self.tokens[self.offsets[i] : self.offsets[i + 1]], dtype=np.int64)


def _load(path: str) -> np.ndarray:
    if not Path(path).is_file():
        raise DataError("binarised file missing; re-run preprocessing", path=path)
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise DataError(
            f"cannot read binarised file ({e}); it is truncated or damaged: delete the data-bin "
            "folder and re-run preprocessing",
            path=path,
        ) from e
