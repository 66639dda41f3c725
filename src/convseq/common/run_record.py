"""A run folder's record is written once, by the command that owns the folder.

Hydra writes a run's record, `.hydra/config.yaml`, `hydra.yaml` and `overrides.yaml`, and opens
its log (`run.log`) before the task starts. Into a folder that already holds a run, a command
that is then refused (`this folder already holds a run`, a truncated checkpoint to resume from,
a value rejected before the task starts) would leave that run's record rewritten by a command
that never ran. So:

- `hydra.output_subdir` is `${convseq_record_dir:${hydra.runtime.output_dir}}`
  (conf/common.yaml): `.hydra` in a folder that holds no record yet, else a staging folder
  `.hydra.staged-<pid>` beside it (`record_dir`, decided once per job);
- `run_record()`, around run.py's task function, sends a staged command's log lines to the
  staging folder too, moves both into place when the command takes the folder
  (`claim_run_folder`: task=train once its checks have passed, before it writes anything; any
  other task once it has finished) and deletes them when the command fails before: the existing
  run's files stay as they were, byte for byte;
- a single run that fails in a folder it owns leaves its one-line error in `error.txt`, which
  the reports show as `failed: <error>` (a sweep job's: `convseq.cli.hydra_callbacks`); the
  next owner's claim deletes it.

Ranks other than the first of a multi-process launch write no record (`hydra.output_subdir=null`:
`convseq.cli.rank_args`) and never stage. This module imports only the standard library and
OmegaConf, Hydra when a job runs; importing it registers the resolver, so that a launcher's
worker process that unpickles run.py's task function has it before its job's record is written.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

__all__ = [
    "ERROR_FILE",
    "RECORD_DIR",
    "claim_run_folder",
    "error_line",
    "owns_record",
    "record_dir",
    "register_resolver",
    "run_record",
    "write_error",
]

RECORD_DIR = ".hydra"  # Hydra's own name for it
ERROR_FILE = "error.txt"  # a failed run's one-line error (convseq.evaluation.history)
STAGED_PREFIX = ".hydra.staged-"
RESOLVER = "convseq_record_dir"
SIGNALLED = 75  # EX_TEMPFAIL: a run cut short by a signal; its summary.json says so

# output folder -> the record folder chosen for this process's job there (RECORD_DIR or staged)
_chosen: dict[str, str] = {}


def record_dir(output_dir: str) -> str:
    """The folder, relative to `output_dir`, that Hydra writes this job's record into:
    `.hydra` where there is none yet, else `.hydra.staged-<pid>`. Decided at the first call of
    the job and kept (Hydra reads the value more than once, the last time after writing)."""
    key = os.path.abspath(output_dir)
    if key not in _chosen:
        held = os.path.isdir(os.path.join(key, RECORD_DIR))
        _chosen[key] = f"{STAGED_PREFIX}{os.getpid()}" if held else RECORD_DIR
    return _chosen[key]


def register_resolver() -> None:
    """Register `${convseq_record_dir:OUTPUT_DIR}` (conf/common.yaml's hydra.output_subdir)."""
    OmegaConf.register_new_resolver(RESOLVER, record_dir, replace=True)


register_resolver()


def error_line(e: BaseException) -> str:
    """The first line of what ended a command: a SystemExit's message, or the cause of the
    SystemExit that convseq's one-line errors end with, or the exception and its message."""
    cause = e.__cause__ if isinstance(e, SystemExit) and e.__cause__ is not None else e
    if isinstance(cause, SystemExit):  # SystemExit("message"): the message is its code
        message = str(cause.code)
    else:
        message = f"{type(cause).__name__}: {cause}"
    return (message.strip().splitlines() or ["(no message)"])[0]


def failed(e: BaseException) -> bool:
    """Whether `e` ends a command as a failure (not a clean exit, not a signal's 75)."""
    return not isinstance(e, SystemExit) or e.code not in (None, 0, SIGNALLED)


def write_error(output_dir: str | os.PathLike, e: BaseException) -> None:
    """Leave `e`'s one line in `<output_dir>/error.txt`; never raises (the error itself
    matters more than its record)."""
    with contextlib.suppress(OSError):
        (Path(output_dir) / ERROR_FILE).write_text(error_line(e) + "\n")


def _send_to(handler: logging.FileHandler, path: Path) -> None:
    """Point a log file handler at `path` (appended to), closing the file it wrote before."""
    stream = open(path, "a", encoding=handler.encoding, errors=handler.errors)  # noqa: SIM115
    old = handler.setStream(stream)
    handler.baseFilename = str(path)
    if old is not None:
        old.close()


@dataclass
class _Staged:
    """A job's record staged beside an existing one: the staging folder and the log handlers
    sent there, each with the file it wrote to."""

    output_dir: Path
    staging: Path
    logs: list[tuple[logging.FileHandler, Path]] = field(default_factory=list)
    settled: bool = False

    @classmethod
    def open(cls, output_dir: Path, name: str) -> _Staged:
        staged = cls(output_dir, output_dir / name)
        staged.staging.mkdir(parents=True, exist_ok=True)
        for handler in logging.getLogger().handlers:
            own = Path(getattr(handler, "baseFilename", ""))
            if isinstance(handler, logging.FileHandler) and own.parent == output_dir:
                _send_to(handler, staged.staging / own.name)
                staged.logs.append((handler, own))
        return staged

    def claim(self) -> None:
        """Move the staged record into `.hydra/` and append the staged log lines to the log."""
        if self.settled:
            return
        self.settled = True
        logs = {Path(h.baseFilename) for h, _ in self.logs}
        for handler, own in self.logs:
            with _locked(handler):
                handler.flush()
                with open(own, "ab") as out:
                    out.write(Path(handler.baseFilename).read_bytes())
                _send_to(handler, own)
        record = self.output_dir / RECORD_DIR
        record.mkdir(exist_ok=True)
        for path in self.staging.iterdir():
            if path not in logs:
                os.replace(path, record / path.name)
        shutil.rmtree(self.staging, ignore_errors=True)
        (self.output_dir / ERROR_FILE).unlink(missing_ok=True)
        _chosen[str(self.output_dir)] = RECORD_DIR  # the record Hydra's config names from now on

    def discard(self) -> None:
        """Delete the staged record and log: the folder's files stay as they were."""
        if self.settled:
            return
        self.settled = True
        for handler, _ in self.logs:
            logging.getLogger().removeHandler(handler)
            handler.close()
        shutil.rmtree(self.staging, ignore_errors=True)


@contextlib.contextmanager
def _locked(handler: logging.Handler) -> Iterator[None]:
    handler.acquire()
    try:
        yield
    finally:
        handler.release()


_active: list[_Staged] = []  # the staged record of the job running in this process


def claim_run_folder() -> bool:
    """Take the run folder: the record a staged command holds back moves into place.

    task=train calls it once its checks have passed, before it writes into the folder. Returns
    whether a staged record was moved (False: none was staged, or it already was).
    """
    if not _active or _active[-1].settled:
        return False
    _active[-1].claim()
    return True


@dataclass(frozen=True)
class _Job:
    """The Hydra job running in this process: its folder, the record folder Hydra wrote into
    (None: a rank that writes no record) and whether it is a single run (not a sweep's job)."""

    output_dir: Path
    subdir: str | None
    single: bool


def _job() -> _Job | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    output_dir = Path(os.path.abspath(hydra_cfg.runtime.output_dir))
    return _Job(output_dir, hydra_cfg.output_subdir, hydra_cfg.mode == RunMode.RUN)


def owns_record() -> bool:
    """Whether the Hydra job running here has written its folder's record: not a rank that
    writes none, nor a command whose record is still staged beside an existing one."""
    job = _job()
    return job is not None and job.subdir is not None and not job.subdir.startswith(STAGED_PREFIX)


@contextlib.contextmanager
def run_record() -> Iterator[None]:
    """run.py's task function runs inside it: a staged record is claimed when the task ends
    (unless the task claimed it before) and deleted when the command fails first; a single run
    that fails in a folder it owns leaves its error in `error.txt`."""
    job = _job()
    staged = None
    if job is not None and job.subdir is not None and job.subdir.startswith(STAGED_PREFIX):
        staged = _Staged.open(job.output_dir, job.subdir)
        _active.append(staged)
    try:
        yield
    except BaseException as e:
        if staged is not None and not staged.settled and failed(e):
            staged.discard()
        elif staged is not None and not staged.settled:
            staged.claim()  # a clean exit (SystemExit(0), or a signal's 75)
        elif job is not None and job.single and failed(e) and owns_record():
            write_error(job.output_dir, e)
        raise
    else:
        if staged is not None:
            staged.claim()
    finally:
        if staged is not None:
            _active.remove(staged)
        if job is not None:
            _chosen.pop(str(job.output_dir), None)
