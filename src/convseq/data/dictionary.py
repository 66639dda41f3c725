"""A vocabulary in fairseq's format: `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3, then the symbols.

A `dict.txt` holds one `symbol count` line per symbol after the four specials, which are implicit
and never written. `finalize` sorts by count (ties alphabetically, as fairseq does), applies the
`threshold` and `nwords` limits and pads the vocabulary to a multiple of `padding_factor` with
`madeupwordNNNN 0` rows, so that embedding sizes match fairseq's for the same data.

A line ending in ` #fairseq:overwrite` may repeat a symbol (a special one too). As in fairseq's
`Dictionary.add_from_file`, the repeat takes a new id at its place in the file and the symbol
then maps to that id; the earlier id keeps its row. `save` writes the flag back on such a line.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from convseq.common.specials import BOS, EOS, PAD, SPECIAL_SYMBOLS, UNK
from convseq.errors import DataError

OVERWRITE = " #fairseq:overwrite"  # fairseq's flag on a dict.txt line that repeats a symbol


class Dictionary:
    """A mapping from symbols to consecutive integer ids (fairseq-compatible)."""

    def __init__(self) -> None:
        self.symbols: list[str] = []
        self.count: list[int] = []
        self.indices: dict[str, int] = {}
        self.bos_index = self.add_symbol(BOS)
        self.pad_index = self.add_symbol(PAD)
        self.eos_index = self.add_symbol(EOS)
        self.unk_index = self.add_symbol(UNK)
        self.nspecial = len(self.symbols)

    # -- fairseq's accessors ------------------------------------------------------------------
    def bos(self) -> int:
        return self.bos_index

    def pad(self) -> int:
        return self.pad_index

    def eos(self) -> int:
        return self.eos_index

    def unk(self) -> int:
        return self.unk_index

    def __len__(self) -> int:
        return len(self.symbols)

    def __getitem__(self, idx: int) -> str:
        return self.symbols[idx] if 0 <= idx < len(self.symbols) else UNK

    def __contains__(self, sym: str) -> bool:
        return sym in self.indices

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dictionary) and self.symbols == other.symbols

    def index(self, sym: str) -> int:
        """The id of `sym`, or the unknown id."""
        return self.indices.get(sym, self.unk_index)

    # -- building -----------------------------------------------------------------------------
    def add_symbol(self, sym: str, n: int = 1, overwrite: bool = False) -> int:
        """Add `n` occurrences of `sym` (creating it if new); return its id.

        With `overwrite`, a symbol already present gets a new id with count `n` (fairseq's
        `#fairseq:overwrite`).
        """
        idx = self.indices.get(sym)
        if idx is not None and not overwrite:
            self.count[idx] += n
            return idx
        idx = len(self.symbols)
        self.indices[sym] = idx
        self.symbols.append(sym)
        self.count.append(n)
        return idx

    def add_counts(self, counts: Counter) -> None:
        """Add every symbol of a Counter with its count."""
        for sym, n in counts.items():
            self.add_symbol(sym, n)

    def finalize(self, threshold: int = -1, nwords: int = -1, padding_factor: int = 8) -> None:
        """Sort by count, keep the `nwords` most frequent with count >= `threshold`, pad to 8.

        Ties in count are broken alphabetically, as fairseq's finalize does; the specials keep
        their ids 0-3.
        """
        if nwords <= 0:
            nwords = len(self)
        specials = self.symbols[: self.nspecial]
        special_counts = self.count[: self.nspecial]
        # Alphabetical first, then a stable sort by descending count: ties stay alphabetical.
        rest = sorted(zip(self.symbols[self.nspecial :], self.count[self.nspecial :]))
        rest.sort(key=lambda sc: -sc[1])
        kept = [(s, c) for s, c in rest[: max(nwords - self.nspecial, 0)] if c >= threshold]
        self.symbols = specials + [s for s, _ in kept]
        self.count = special_counts + [c for _, c in kept]
        self.indices = {s: i for i, s in enumerate(self.symbols)}
        self.pad_to_multiple(padding_factor)

    def pad_to_multiple(self, padding_factor: int = 8) -> None:
        """Append `madeupwordNNNN` symbols (count 0) until the size is a multiple."""
        if padding_factor <= 1:
            return
        i = 0
        while len(self) % padding_factor != 0:
            sym = f"madeupword{i:04d}"
            if sym not in self.indices:
                self.add_symbol(sym, n=0)
            i += 1

    @classmethod
    def build(
        cls,
        lines: Iterable[str],
        threshold: int = -1,
        nwords: int = -1,
        padding_factor: int = 8,
    ) -> Dictionary:
        """Build and finalize a dictionary from whitespace-tokenized lines."""
        counts: Counter = Counter()
        for line in lines:
            counts.update(line.split())
        d = cls()
        d.add_counts(counts)
        d.finalize(threshold=threshold, nwords=nwords, padding_factor=padding_factor)
        return d

    # -- encoding -----------------------------------------------------------------------------
    def encode(self, tokens: Sequence[str], append_eos: bool = True) -> np.ndarray:
        """Token ids of a tokenized sentence (unknown words -> unk), with EOS appended."""
        ids = [self.indices.get(t, self.unk_index) for t in tokens]
        if append_eos:
            ids.append(self.eos_index)
        return np.asarray(ids, dtype=np.int64)

    def encode_line(self, line: str, append_eos: bool = True) -> np.ndarray:
        """Token ids of a whitespace-tokenized line."""
        return self.encode(line.split(), append_eos=append_eos)

    def string(self, ids: Iterable[int], strip_special: bool = True) -> str:
        """Tokens joined by spaces; pad, EOS and BOS dropped when `strip_special`."""
        out = []
        for i in ids:
            i = int(i)
            if strip_special and i in (self.pad_index, self.eos_index, self.bos_index):
                continue
            out.append(self[i])
        return " ".join(out)

    # -- files ----------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write fairseq's dict.txt (`symbol count` per line, specials omitted), atomically."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        seen = set(self.symbols[: self.nspecial])
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for sym, n in zip(self.symbols[self.nspecial :], self.count[self.nspecial :]):
                # a repeated symbol is written with its flag, so that the file loads again
                f.write(f"{sym} {n}{OVERWRITE if sym in seen else ''}\n")
                seen.add(sym)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Dictionary:
        """Read a fairseq dict.txt; a malformed line raises a DataError naming file and line."""
        d = cls()
        path = Path(path)
        if not path.is_file():
            raise DataError("dictionary file not found", path=str(path))
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise DataError(
                f"not valid UTF-8 ({e.reason} at byte {e.start})", path=str(path)
            ) from e
        for lineno, raw in enumerate(text.splitlines(), start=1):
            line = raw.rstrip()
            if not line:
                raise DataError(
                    "empty line; expected '<symbol> <count>'", path=str(path), line=lineno
                )
            overwrite = line.endswith(OVERWRITE)
            if overwrite:
                line = line[: -len(OVERWRITE)]
            sym, sep, cnt = line.rpartition(" ")
            if not sep or not sym or not cnt.lstrip("-").isdigit():
                raise DataError(
                    f"malformed line {raw!r}; expected '<symbol> <count>'",
                    path=str(path),
                    line=lineno,
                )
            if sym in d.indices and not overwrite:
                raise DataError(
                    f"duplicate symbol {sym!r}; each symbol may appear once (a repeat that "
                    "should take a new id ends in ' #fairseq:overwrite')",
                    path=str(path),
                    line=lineno,
                )
            d.add_symbol(sym, int(cnt), overwrite=overwrite)
        return d

    # -- checkpoints -----------------------------------------------------------------------------
    def to_list(self) -> list[str]:
        """The symbols as a plain list (for checkpoints loadable with weights_only=True)."""
        return list(self.symbols)

    @classmethod
    def from_list(cls, symbols: Sequence[str]) -> Dictionary:
        """Rebuild from `to_list()`; the first four symbols must be the specials."""
        if tuple(symbols[:4]) != SPECIAL_SYMBOLS:
            raise DataError(
                f"vocabulary must start with {BOS} {PAD} {EOS} {UNK}, got {symbols[:4]}"
            )
        d = cls()
        for s in symbols[4:]:
            d.add_symbol(s, 0, overwrite=True)  # a repeat keeps its own id, as when loaded
        return d
