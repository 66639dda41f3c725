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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice
from pathlib import Path

import numpy as np

from convseq.errors import DataError

#: Why a pair was left out of a split (the keys of `PairFilter.skipped`).
SKIP_REGEX = "drop_train_regex"
SKIP_EMPTY = "empty"
SKIP_TOO_LONG = "too_long"

# Bytes read at a time: big enough that per-block costs vanish, small enough that a block and
# its copies (the cut, the decoded text, its lines) stay a few MiB whatever the size of the file.
BLOCK_BYTES = 1 << 20


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
    return file_sha256_and_newlines(path)[0]


def file_sha256_and_newlines(path: str | os.PathLike) -> tuple[str, int]:
    """Hex sha256 of a file's bytes and its count of `\\n` bytes (the file must exist)."""
    h = hashlib.sha256()
    newlines = 0
    with open(require_file(path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            newlines += block.count(b"\n")
    return h.hexdigest(), newlines


@dataclass
class TextInfo:
    """What a full read of a text file found: its checksum, size, line count and line endings."""

    path: Path
    sha256: str
    num_bytes: int
    num_lines: int
    crlf: bool = False  # the file had CRLF line endings (normalised away)
    newlines: int = 0  # `\\n` bytes: what `file_sha256_and_newlines` counts without decoding
    has_text: bool = False  # some line holds more than whitespace (an empty split has none)

    def __len__(self) -> int:
        return self.num_lines


class TextStream:
    """The lines of a UTF-8 text file, read in blocks of whole lines and checked on the way.

    Iterating yields the lines of one block at a time (stripped when `strip`), so memory holds
    one block whatever the size of the file. The checks are those of `read_text_file`: bytes
    that are not UTF-8 raise at once, with their line; a stray carriage return raises once the
    whole file is read, so that a UTF-8 error anywhere in the file is reported first, as when
    the file was decoded in one piece. After a complete iteration `info` holds the checksum,
    size and line count; with `expect_sha256`, a file whose bytes changed since is an error.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        strip: bool = True,
        expect_sha256: str | None = None,
        block_bytes: int | None = None,
    ):
        self.path = require_file(path)
        self.strip = strip
        self.expect_sha256 = expect_sha256
        self.block_bytes = block_bytes or BLOCK_BYTES
        self.info: TextInfo | None = None

    def __iter__(self) -> Iterator[list[str]]:
        for text, _ in self._blocks():
            # "" has no line; "\n" has one empty line; a missing final newline still ends one.
            lines = text.split("\n")
            if not text or text.endswith("\n"):
                lines.pop()
            # str.strip() also removes Unicode spaces such as U+00A0 (no-break space).
            yield [ln.strip() for ln in lines] if self.strip else lines

    def _blocks(self) -> Iterator[tuple[str, int]]:
        """Decoded blocks of whole lines (BOM dropped, CRLF normalised) and their line counts."""
        digest = hashlib.sha256()
        num_bytes = num_lines = newlines = 0
        crlf = has_text = False
        stray_cr: int | None = None  # line of the first stray \r, reported at the end
        pending = b""  # the unfinished last line of the bytes read so far
        first = True
        with open(self.path, "rb") as f:
            while True:
                data = f.read(self.block_bytes)
                if data:
                    digest.update(data)
                    num_bytes += len(data)
                    buf = pending + data if pending else data
                    # Cut after the last \n: never inside a UTF-8 sequence or a CRLF.
                    cut = buf.rfind(b"\n") + 1
                    if cut == 0:
                        pending = buf
                        continue
                    chunk, pending = buf[:cut], buf[cut:]
                else:
                    chunk, pending = pending, b""
                    if not chunk:
                        break
                text = _decode(chunk, self.path, num_lines)
                if first:
                    first = False
                    if text.startswith("\ufeff"):
                        text = text[1:]
                if "\r" in text:
                    if "\r\n" in text:
                        crlf = True
                        text = text.replace("\r\n", "\n")
                    if stray_cr is None and "\r" in text:
                        stray_cr = num_lines + text.count("\n", 0, text.index("\r")) + 1
                # str.strip() removes what TextStream strips from each line (Unicode spaces too)
                has_text = has_text or bool(text.strip())
                n_newlines = text.count("\n")
                n = n_newlines + (1 if text and not text.endswith("\n") else 0)
                newlines += n_newlines
                num_lines += n
                yield text, n
                if not data:
                    break
        if stray_cr is not None:
            raise DataError(
                "carriage return (\\r) inside a line; a line break must be LF or CRLF: remove the "
                "stray \\r or convert old Mac line endings",
                path=str(self.path),
                line=stray_cr,
            )
        sha = digest.hexdigest()
        if self.expect_sha256 is not None and sha != self.expect_sha256:
            raise DataError("file changed while preprocessing; run again", path=str(self.path))
        self.info = TextInfo(self.path, sha, num_bytes, num_lines, crlf, newlines, has_text)

    def lines(self) -> Iterator[str]:
        """The lines one by one."""
        for block in self:
            yield from block


def _decode(chunk: bytes, path: Path, lines_before: int) -> str:
    try:
        return chunk.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"not valid UTF-8 (byte 0x{chunk[e.start]:02x}: {e.reason}); re-encode the file as "
            "UTF-8 (e.g. `iconv -f latin1 -t utf-8`)",
            path=str(path),
            line=lines_before + chunk.count(b"\n", 0, e.start) + 1,
        ) from e


def scan_text_file(
    path: str | os.PathLike,
    expect_sha256: str | None = None,
    block_bytes: int | None = None,
    on_block: Callable[[int], object] | None = None,
) -> TextInfo:
    """Read a whole text file block by block, check it, and return what `TextInfo` holds.

    `on_block` is called with the line count of each block (a progress bar's `update`).

    Raises:
        DataError: as `read_text_file`, and when the bytes do not match `expect_sha256`.
    """
    stream = TextStream(path, strip=False, expect_sha256=expect_sha256, block_bytes=block_bytes)
    for _, n in stream._blocks():  # counting needs no split into lines
        if on_block is not None:
            on_block(n)
    assert stream.info is not None
    return stream.info


def iter_pairs(
    src_path: str | os.PathLike,
    tgt_path: str | os.PathLike,
    n: int,
    src_sha256: str | None = None,
    tgt_sha256: str | None = None,
) -> Iterator[tuple[int, list[str], list[str]]]:
    """(0-based first line, source lines, target lines) of two aligned files, `n` at a time.

    The files were checked before (`scan_text_file`): different line counts, or bytes that no
    longer match the checksums, mean that a file changed since.
    """
    src_lines = TextStream(src_path, expect_sha256=src_sha256).lines()
    tgt_lines = TextStream(tgt_path, expect_sha256=tgt_sha256).lines()
    first = 0
    while True:
        s, t = list(islice(src_lines, n)), list(islice(tgt_lines, n))
        if len(s) != len(t):
            raise DataError("file changed while preprocessing; run again", path=str(src_path))
        if not s:
            return
        yield first, s, t
        first += len(s)


def read_text_file(path: str | os.PathLike, strip: bool = True) -> TextFile:
    """Read a UTF-8 text file into lines (stripped when `strip`), checking it on the way.

    Raises:
        DataError: the file is missing, is not UTF-8 (with the line of the first bad byte), or a
            line holds a carriage return that is not part of a CRLF ending.
    """
    stream = TextStream(path, strip=strip)
    lines = list(chain.from_iterable(stream))
    info = stream.info
    assert info is not None
    return TextFile(
        path=info.path, lines=lines, sha256=info.sha256, num_bytes=info.num_bytes, crlf=info.crlf
    )


def check_same_length(src: TextFile | TextInfo, tgt: TextFile | TextInfo) -> None:
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
        keep = self.text_mask(0, src.lines, tgt.lines, src.path, tgt.path)
        return np.flatnonzero(keep).tolist()

    def text_mask(
        self,
        first_line: int,
        src_lines: Sequence[str],
        tgt_lines: Sequence[str],
        src_path: str | os.PathLike,
        tgt_path: str | os.PathLike,
    ) -> np.ndarray:
        """Which pairs of a block pass the text checks (bool array); `first_line` is 0-based."""
        if not self.is_train:
            return np.ones(len(src_lines), dtype=bool)
        keep = np.zeros(len(src_lines), dtype=bool)
        regex = self._regex
        for j, (s, t) in enumerate(zip(src_lines, tgt_lines)):
            if regex is not None and (regex.fullmatch(s) or regex.fullmatch(t)):
                self.skipped[SKIP_REGEX] += 1
            elif s and t:
                keep[j] = True
            elif self.train_invalid == "error":
                raise DataError(
                    "empty line in the training data (after stripping whitespace); remove the "
                    "pair or set data.train_invalid=skip",
                    path=str(src_path if not s else tgt_path),
                    line=first_line + j + 1,
                )
            else:
                self.skipped[SKIP_EMPTY] += 1
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
        keep = self.length_mask(indices, src_lens, tgt_lens, src.path, tgt.path)
        return np.flatnonzero(keep).tolist()

    def length_mask(
        self,
        lines: Sequence[int] | np.ndarray,
        src_lens: Sequence[int] | np.ndarray,
        tgt_lens: Sequence[int] | np.ndarray,
        src_path: str | os.PathLike,
        tgt_path: str | os.PathLike,
    ) -> np.ndarray:
        """Which pairs fit in max_positions (bool array); `lines[j]` is pair j's 0-based line.

        Lengths are token counts without EOS. An over-long pair is skipped and counted, or, by
        policy, an error naming the first one's file and line (the source side when both are).
        """
        limit = self.max_positions - 1  # EOS takes one position
        src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
        keep = (src_lens <= limit) & (tgt_lens <= limit)
        n_bad = len(keep) - int(np.count_nonzero(keep))
        if n_bad == 0:
            return keep
        if self.train_invalid == "skip" if self.is_train else self.eval_overlong == "skip":
            self.skipped[SKIP_TOO_LONG] += n_bad
            return keep
        j = int(np.argmin(keep))
        ns, nt = int(src_lens[j]), int(tgt_lens[j])
        bad, n = (src_path, ns) if ns > limit else (tgt_path, nt)
        option = "data.train_invalid=skip" if self.is_train else "data.eval_overlong=skip"
        raise DataError(
            f"sentence of {n + 1} tokens (EOS included) is longer than data.max_positions="
            f"{self.max_positions}; shorten it, raise max_positions, or set {option}",
            path=str(bad),
            line=int(lines[j]) + 1,
        )
