"""Reading and checking the parallel text files that preprocessing starts from.

Every problem is a `DataError` naming the file and, where there is one, the 1-based line:
a missing file, bytes that are not UTF-8, a carriage return inside a line, source and target
files of different lengths, and (by policy) empty or over-long sentences.

Lines are split on `\\n` only: `str.splitlines` would also split on form feeds, U+0085 or
U+2028, which some corpora hold inside sentences, and the line numbers would drift from what
an editor shows. CRLF endings are accepted and normalised; a BOM at the start of a file is dropped.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from convseq.errors import DataError

#: Why a pair was left out of a split (the keys of `PairFilter.skipped`).
SKIP_REGEX = "drop_train_regex"
SKIP_EMPTY = "empty"
SKIP_TOO_LONG = "too_long"


@dataclass
class TextFile:
    """The stripped lines of one text file, with where they came from."""

    path: Path
    lines: list[str]
    sha256: str
    num_bytes: int
    crlf: bool = False  # the file had CRLF line endings (normalised away)

    def __len__(self) -> int:
        return len(self.lines)


def require_file(path: str | os.PathLike) -> Path:
    """`path` as a Path; a DataError if it is not an existing file."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "not found"
        raise DataError(
            f"input text file {what}; check data.dir and the split/language names", path=str(path)
        )
    return path


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks (the file must exist)."""
    h = hashlib.sha256()
    with open(require_file(path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_text_file(path: str | os.PathLike, strip: bool = True) -> TextFile:
    """Read a UTF-8 text file into lines (stripped when `strip`), checking it on the way.

    Raises:
        DataError: the file is missing, is not UTF-8 (with the line of the first bad byte), or a
            line holds a carriage return that is not part of a CRLF ending.
    """
    path = require_file(path)
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(
            f"not valid UTF-8 (byte 0x{data[e.start]:02x}: {e.reason}); re-encode the file as "
            "UTF-8 (e.g. `iconv -f latin1 -t utf-8`)",
            path=str(path),
            line=line,
        ) from e
    if text.startswith("\ufeff"):
        text = text[1:]
    crlf = "\r\n" in text
    if crlf:
        text = text.replace("\r\n", "\n")
    # "" has no line; "\n" has one empty line; a missing final newline still ends a line.
    lines = text.split("\n") if text else []
    if text.endswith("\n"):
        lines.pop()
    if "\r" in text:
        line = text.count("\n", 0, text.index("\r")) + 1
        raise DataError(
            "carriage return (\\r) inside a line; a line break must be LF or CRLF: remove the "
            "stray \\r or convert old Mac line endings",
            path=str(path),
            line=line,
        )
    if strip:
        # str.strip() also removes Unicode spaces such as U+00A0 (no-break space).
        lines = [ln.strip() for ln in lines]
    return TextFile(path=path, lines=lines, sha256=digest, num_bytes=len(data), crlf=crlf)


def check_same_length(src: TextFile, tgt: TextFile) -> None:
    """Raise a DataError unless the two sides of a parallel split have the same line count."""
    if len(src) != len(tgt):
        raise DataError(
            f"source and target have different line counts: {src.path} has {len(src)} lines, "
            f"{tgt.path} has {len(tgt)} lines; line i of one must translate line i of the other",
            path=str(src.path),
        )


@dataclass
class PairFilter:
    """The sentence-pair policy of one split.

    Args:
        is_train: train pairs may be dropped; valid/test pairs never are, except over-long ones
            when `eval_overlong == "skip"`.
        max_positions: the longest sentence allowed, in tokens with EOS.
        train_invalid: `skip` (count and drop) or `error`, for empty or over-long train pairs.
        eval_overlong: `error` or `skip`, for over-long valid/test lines.
        drop_regex: train pairs whose source or target fully matches it are dropped.
    """

    is_train: bool
    max_positions: int
    train_invalid: str = "skip"
    eval_overlong: str = "error"
    drop_regex: str | None = None
    skipped: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.train_invalid not in ("skip", "error"):
            raise DataError(
                f"data.train_invalid must be 'skip' or 'error', got {self.train_invalid!r}"
            )
        if self.eval_overlong not in ("skip", "error"):
            raise DataError(
                f"data.eval_overlong must be 'error' or 'skip', got {self.eval_overlong!r}"
            )
        if self.max_positions < 2:
            raise DataError(
                f"data.max_positions must be >= 2 (one token + EOS), got {self.max_positions}"
            )
        self._regex = None
        if self.is_train and self.drop_regex:
            try:
                self._regex = re.compile(self.drop_regex)
            except re.error as e:
                raise DataError(
                    f"data.drop_train_regex {self.drop_regex!r} is not a valid regex: {e}"
                ) from e

    def keep_text(self, src: TextFile, tgt: TextFile) -> list[int]:
        """Indices of the pairs that pass the text checks (regex and emptiness; train only)."""
        if not self.is_train:
            return list(range(len(src)))
        keep: list[int] = []
        for i, (s, t) in enumerate(zip(src.lines, tgt.lines)):
            if self._regex is not None and (self._regex.fullmatch(s) or self._regex.fullmatch(t)):
                self.skipped[SKIP_REGEX] += 1
                continue
            if not s or not t:
                if self.train_invalid == "error":
                    bad = src if not s else tgt
                    raise DataError(
                        "empty line in the training data (after stripping whitespace); remove the "
                        "pair or set data.train_invalid=skip",
                        path=str(bad.path),
                        line=i + 1,
                    )
                self.skipped[SKIP_EMPTY] += 1
                continue
            keep.append(i)
        return keep

    def keep_lengths(
        self,
        indices: Sequence[int],
        src_lens: Sequence[int],
        tgt_lens: Sequence[int],
        src: TextFile,
        tgt: TextFile,
    ) -> list[int]:
        """Positions `j` of the pairs whose token counts (without EOS) fit in max_positions.

        `src_lens[j]` / `tgt_lens[j]` are the lengths of the pair on input line `indices[j] + 1`.
        """
        keep: list[int] = []
        limit = self.max_positions - 1  # EOS takes one position
        skip = self.train_invalid == "skip" if self.is_train else self.eval_overlong == "skip"
        for j, (i, ns, nt) in enumerate(zip(indices, src_lens, tgt_lens)):
            if ns <= limit and nt <= limit:
                keep.append(j)
                continue
            if skip:
                self.skipped[SKIP_TOO_LONG] += 1
                continue
            bad, n = (src, ns) if ns > limit else (tgt, nt)
            option = "data.train_invalid=skip" if self.is_train else "data.eval_overlong=skip"
            raise DataError(
                f"sentence of {n + 1} tokens (EOS included) is longer than data.max_positions="
                f"{self.max_positions}; shorten it, raise max_positions, or set {option}",
                path=str(bad.path),
                line=i + 1,
            )
        return keep
