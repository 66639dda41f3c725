"""Checkpoint files: atomic writes, clear errors on unreadable files, and finding what to resume.

Lightning's own `TorchCheckpointIO` serialises into memory and then writes the target path in
place, so a crash or a full disk half-way leaves a truncated `last.ckpt` and the run cannot be
resumed. `AtomicCheckpointIO` writes a temporary file in the same folder (so the final rename
never crosses file systems), flushes and fsyncs it, then `os.replace`s it over the target and
fsyncs the folder: readers see the old file or the new one, never a mix.
"""

from __future__ import annotations

import os
import pickle
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from convseq.errors import CheckpointError

CHECKPOINT_DIR = "checkpoints"
LAST = "last.ckpt"
BEST = "best.ckpt"

# What torch.load raises on a truncated, corrupt or non-checkpoint file (weights_only refusals
# are UnpicklingErrors too).
READ_ERRORS = (
    RuntimeError,
    EOFError,
    OSError,
    ValueError,
    pickle.UnpicklingError,
    zipfile.BadZipFile,
)


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """`torch.save(obj, path)` so that `path` is either untouched or completely written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    # os.open with 0o666: the umask applies, as for any file the user creates (mkstemp: 0600).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make a rename inside `folder` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(
    path: str | os.PathLike,
    map_location: Any = "cpu",
    weights_only: bool | None = None,
) -> dict[str, Any]:
    """`torch.load` a checkpoint; a missing or unreadable file raises CheckpointError naming it.

    Args:
        path: the checkpoint file.
        map_location: passed to torch.load.
        weights_only: passed to torch.load (None = torch's default, True on torch >= 2.6).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=weights_only)
    except READ_ERRORS as e:
        raise CheckpointError(
            f"{path}: not a readable checkpoint ({type(e).__name__}: {_first_line(e)}); it may be "
            "truncated or corrupt: resume from another file (e.g. best.ckpt or an epochNNN.ckpt)"
        ) from e
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path}: holds a {type(ckpt).__name__}, not a checkpoint dict")
    return ckpt


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else ""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning CheckpointIO with atomic, fsynced writes and CheckpointError on bad reads."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(
        self,
        path: str | os.PathLike,
        map_location: Callable | Any = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        return load_checkpoint(path, map_location=map_location, weights_only=weights_only)


def resolve_resume(resume: Any, output_dir: str | os.PathLike) -> Path | None:
    """The checkpoint a run continues from, or None for a fresh run.

    Args:
        resume: the `resume` setting: false/None (fresh run), true (this run's own
            `<output_dir>/checkpoints/last.ckpt`), or a path: a checkpoint file, a run folder
            (its `checkpoints/last.ckpt`) or a checkpoints folder (its `last.ckpt`).
        output_dir: this run's folder.

    Raises:
        CheckpointError: the checkpoint asked for does not exist.
    """
    if (
        resume is None
        or resume is False
        or (isinstance(resume, str) and resume.lower() in ("", "false", "no"))
    ):
        return None
    if resume is True or (isinstance(resume, str) and resume.lower() in ("true", "yes")):
        path = Path(output_dir) / CHECKPOINT_DIR / LAST
        if not path.is_file():
            raise CheckpointError(
                f"{path}: resume=true found no checkpoint to continue from; set hydra.run.dir to "
                "the folder of the run to continue (it holds checkpoints/last.ckpt), or "
                "resume=PATH to a run folder or a .ckpt file"
            )
        return path
    if not isinstance(resume, (str, os.PathLike)):
        raise CheckpointError(f"resume={resume!r}: expected true, false or a path")
    path = Path(os.path.expanduser(str(resume))).absolute()
    if path.is_file():
        return path
    for candidate in (path / CHECKPOINT_DIR / LAST, path / LAST):
        if candidate.is_file():
            return candidate
    raise CheckpointError(
        f"{path}: resume=PATH needs a checkpoint file, a run folder holding "
        f"{CHECKPOINT_DIR}/{LAST}, or a {CHECKPOINT_DIR} folder holding {LAST}; none found"
    )
