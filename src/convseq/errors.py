"""Errors convseq raises on bad input: each names the file, line or key and says what to do."""

from __future__ import annotations


class ConvseqError(Exception):
    """Base class of every error convseq raises on purpose (never a bug)."""


class SettingError(ConvseqError, ValueError):
    """A config value convseq cannot use (the message names the key and what to give)."""


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


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint could not be written (full disk, read-only or unwritable folder).

    Also an OSError, with the errno of the failure; the file it was replacing is left intact.
    """

    def __init__(self, message: str, errno: int | None = None):
        super().__init__(message)
        self.errno = errno


class NonFiniteError(ConvseqError, FloatingPointError):
    """The loss or the gradient norm became NaN or inf during training.

    `crash_checkpoint` is set once the state at the failure has been saved; the message then
    names the file.
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message
        self.crash_checkpoint: str | None = None

    def __str__(self) -> str:
        if self.crash_checkpoint is None:
            return self.message
        return f"{self.message} The state at the failure is saved in {self.crash_checkpoint}."
