"""Checkpoint files: atomic writes, clear errors on unreadable files, and finding what to resume.

Lightning's own `TorchCheckpointIO` serialises into memory and then writes the target path in
place, so a crash or a full disk half-way leaves a truncated `last.ckpt` and the run cannot be
resumed. `AtomicCheckpointIO` writes a temporary file in the same folder (so the final rename
never crosses file systems), flushes and fsyncs it, then `os.replace`s it over the target and
fsyncs the folder: readers see the old file or the new one, never a mix. A write that fails
(full disk, read-only folder) raises `CheckpointWriteError` and leaves the old file in place; a
process killed in the middle leaves only its temporary file, removed when the run is resumed
(`remove_stale_temps`).

Every read is weights-only (`torch.load(weights_only=True)`, whatever torch's default or
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` say): convseq's checkpoints hold only tensors and plain
values, and a file whose pickle references anything else is refused, never unpickled.
"""

from __future__ import annotations

import difflib
import os
import pickle
import re
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from convseq.errors import CheckpointError, CheckpointWriteError

CHECKPOINT_DIR = "checkpoints"
LAST = "last.ckpt"
BEST = "best.ckpt"
CRASH = "crash.ckpt"  # the state at a non-finite loss or gradient (never resumed from by default)
# A convseq checkpoint's entry for the segmentation of its training data
# (`convseq.data.subword.text_processing`): raw text translates from the checkpoint alone.
TEXT_KEY = "convseq_text"
# Temporary files of atomic_torch_save: .<name>.<pid>.<8 hex>.tmp
_TEMP = re.compile(r"^\..+\.(\d+)\.[0-9a-f]{8}\.tmp$")


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """`torch.save(obj, path)` so that `path` is either untouched or completely written.

    Raises:
        CheckpointWriteError: the folder cannot be created or written, or the disk is full; the
            message names the file and says that the previous one is unchanged.
    """
    path = Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # os.open with 0o666: the umask applies, as for any file the user creates (mkstemp: 0600).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        raise write_error(path, e) from e
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        cause = _os_error(e)
        if cause is not None:
            raise write_error(path, cause) from e
        raise
    _fsync_dir(path.parent)


def _os_error(e: BaseException | None) -> OSError | None:
    """The OSError behind `e`: torch's zip writer turns a failed write into a RuntimeError."""
    for _ in range(4):
        if e is None or isinstance(e, CheckpointError):
            return None
        if isinstance(e, OSError):
            return e
        e = e.__cause__ or e.__context__
    return None


def write_error(path: Path, e: OSError) -> CheckpointWriteError:
    """The CheckpointWriteError for a failed write of `path` (disk full, folder not writable)."""
    state = f"the previous {path.name} is unchanged" if path.exists() else "nothing was written"
    return CheckpointWriteError(
        f"{path}: cannot write the checkpoint ({e.strerror or e}); {state}. Free disk space or "
        f"make {path.parent} writable (or choose another hydra.run.dir), then continue with "
        "resume=true",
        errno=e.errno,
    )


def check_writable(folder: Path) -> None:
    """Create `folder` and write (then remove) a small file in it, so a run fails at its start.

    Raises:
        CheckpointWriteError: naming the folder and the reason.
    """
    probe = folder / f".write-test.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        os.unlink(probe)
    except OSError as e:
        raise CheckpointWriteError(
            f"{folder}: cannot write checkpoints there ({e.strerror or e}); choose a writable "
            "hydra.run.dir (paths.output_dir)",
            errno=e.errno,
        ) from e


def remove_stale_temps(folder: Path) -> list[Path]:
    """Delete temporary files that killed processes left in `folder`; return them.

    A temporary file of a process that is still running (another rank saving) is kept.
    """
    removed = []
    for tmp in folder.glob(".*.tmp") if folder.is_dir() else ():
        m = _TEMP.match(tmp.name)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            tmp.unlink()
            removed.append(tmp)
        except FileNotFoundError:
            pass
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


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
    path: str | os.PathLike, map_location: Any = "cpu", weights_only: bool = True
) -> dict[str, Any]:
    """Weights-only `torch.load` of a checkpoint; bad files raise CheckpointError naming them.

    Args:
        path: the checkpoint file.
        map_location: passed to torch.load.
        weights_only: must be True (kept so that callers can say so explicitly).

    Raises:
        CheckpointError: the file is missing, truncated, not a checkpoint, not a dict, or its
            pickle references globals that weights-only loading refuses (it is never unpickled).
    """
    if weights_only is not True:
        raise ValueError("convseq loads checkpoints weights-only (weights_only=True) only")
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        # Explicit True: TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD only changes an unset weights_only.
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # the weights-only unpickler runs no code: any error is a bad file
        raise read_error(path, e) from (None if is_refused(e) else e)
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path}: holds a {type(ckpt).__name__}, not a checkpoint dict")
    return ckpt


def is_refused(e: BaseException) -> bool:
    """Whether `e` is torch's weights-only refusal (as opposed to a damaged file)."""
    return isinstance(e, pickle.UnpicklingError) and str(e).startswith("Weights only load failed")


def read_error(path: str | os.PathLike, e: BaseException) -> CheckpointError:
    """The CheckpointError for a failed weights-only `torch.load` of `path`."""
    path = Path(path)
    if is_refused(e):
        # torch's own message suggests weights_only=False, which convseq never does.
        found = sorted(set(re.findall(r"GLOBAL ([\w.]+)", str(e)))) or ["an unknown global"]
        return CheckpointError(
            f"{path}: refused: its pickle references {', '.join(found)}, which weights-only "
            "loading does not allow (unpickling it could run code from the file). convseq "
            "checkpoints hold only tensors and plain values; a fairseq checkpoint is converted "
            "with task=import_fairseq ckpt=PATH"
        )
    return CheckpointError(
        f"{path}: not a readable checkpoint ({type(e).__name__}: {_first_line(e)}); it may be "
        "truncated or corrupt: resume from another file (e.g. best.ckpt or an epochNNN.ckpt)"
    )


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else ""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning CheckpointIO: atomic, fsynced writes; weights-only reads; CheckpointError.

    `saved_listeners` are called with each file's path once it is written (the job log's
    checkpoint lines): every checkpoint Lightning and convseq's callbacks write passes here.
    """

    def __init__(self) -> None:
        super().__init__()
        self.saved_listeners: list[Callable[[Path], None]] = []

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        atomic_torch_save(checkpoint, path)
        for listener in self.saved_listeners:
            listener(Path(path))

    def load_checkpoint(
        self,
        path: str | os.PathLike,
        map_location: Callable | Any = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        # Always weights-only, whatever Lightning passes (None unless the user set it).
        return load_checkpoint(path, map_location=map_location)


def checkpoints_folder(path: str | os.PathLike) -> Path:
    """The folder of a run's checkpoint files: a run folder's `checkpoints/`, or `path` itself
    (a checkpoints folder, or anything else, as it is)."""
    path = Path(path)
    return path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path


def find_checkpoint(path: str | os.PathLike, names: Sequence[str]) -> Path | None:
    """The first of `names` (e.g. best.ckpt, last.ckpt) that is a file in the checkpoints folder
    of `path` (a run folder or a checkpoints folder, `checkpoints_folder`); None if none is."""
    folder = checkpoints_folder(path)
    return next((folder / name for name in names if (folder / name).is_file()), None)


# The words `resume` takes besides a path (its other spellings: yes / no, an empty value).
RESUME_WORDS = ("false", "true", "auto")
_ACCEPTED = (
    "resume takes false (a new run), true (continue this run folder's checkpoints/last.ckpt), "
    "auto (continue it when it exists, else start), or the path of a checkpoint file, a run "
    "folder or a checkpoints folder"
)


def resolve_resume(resume: Any, output_dir: str | os.PathLike) -> Path | None:
    """The checkpoint a run continues from, or None for a fresh run.

    Args:
        resume: the `resume` setting: false/None (fresh run), true (this run's own
            `<output_dir>/checkpoints/last.ckpt`), auto (that file when it exists, else a fresh
            run: the one command of a job script that is started and requeued), or a path: a
            checkpoint file, a run folder (its `checkpoints/last.ckpt`) or a checkpoints folder
            (its `last.ckpt`).
        output_dir: this run's folder.

    Raises:
        CheckpointError: the checkpoint asked for does not exist, or `resume` is neither one of
            the words nor an existing path (the message lists what it takes).
    """
    word = resume.strip().lower() if isinstance(resume, str) else resume
    if word is None or word is False or word in ("", "false", "no"):
        return None
    own = Path(output_dir) / CHECKPOINT_DIR / LAST
    if word == "auto":
        # is_file, not exists: a folder holding only .hydra/ and run.log (Hydra writes them
        # before the task starts) is a fresh run
        return own if own.is_file() else None
    if word is True or word in ("true", "yes"):
        if not own.is_file():
            raise CheckpointError(
                f"{own}: resume=true found no checkpoint to continue from; set hydra.run.dir to "
                "the folder of the run to continue (it holds checkpoints/last.ckpt), resume=PATH "
                "to a run folder or a .ckpt file, or resume=auto to start when there is none"
            )
        return own
    if not isinstance(resume, (str, os.PathLike)):
        raise CheckpointError(f"resume={resume!r}: not understood; {_ACCEPTED}")
    return _resume_path(resume)


def _resume_path(resume: str | os.PathLike) -> Path:
    """The checkpoint of `resume=PATH`; a bare word that names nothing is taken for a typo."""
    path = Path(os.path.expanduser(str(resume))).absolute()
    found = path if path.is_file() else find_checkpoint(path, [LAST])
    if found is not None:
        return found
    text = str(resume)
    if not path.exists() and os.sep not in text and "/" not in text:
        close = difflib.get_close_matches(text.lower(), RESUME_WORDS, n=1, cutoff=0.5)
        hint = f" (did you mean resume={close[0]}?)" if close else ""
        raise CheckpointError(
            f"resume={text}: neither a setting nor an existing file or folder{hint}; {_ACCEPTED}"
        )
    raise CheckpointError(
        f"{path}: resume=PATH needs a checkpoint file, a run folder holding "
        f"{CHECKPOINT_DIR}/{LAST}, or a {CHECKPOINT_DIR} folder holding {LAST}; none found "
        f"({_ACCEPTED})"
    )
