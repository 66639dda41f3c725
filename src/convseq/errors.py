"""Errors convseq raises on bad input: each names the file, line or key and says what to do."""

from __future__ import annotations


class ConvseqError(Exception):
    """Base class of every error convseq raises on purpose (never a bug)."""


class DataError(ConvseqError, ValueError):
    """A corpus, dictionary or data-bin is missing, malformed or inconsistent.

    Args:
        message: what is wrong and what to do.
        path: the file concerned, if any (prefixed to the message).
        line: the 1-based line number concerned, if any.
    """

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        self.path = path
        self.line = line
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)


class CheckpointError(ConvseqError):
    """A checkpoint cannot be read, is not a checkpoint, or does not match the model or data."""
