"""The jobs of a sweep, as read from their folders: overrides, summary.json, per-epoch history.

A Hydra multirun leaves one folder per job under `hydra.sweep.dir`, each with
`.hydra/overrides.yaml` and, once train() finished, `summary.json`. A job without one is read from
its `csv/metrics.csv`. A job or run that raised in a folder it owns leaves `error.txt`
(`convseq.common.run_record`), which makes it `failed: <error>`, summary.json or not (that of
an earlier run a failed `resume=` continued). A single run folder under the folder a report
reads is listed the same way. `convseq.evaluation.report` turns the jobs into the sweep report.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convseq.errors import DataError
from convseq.evaluation.history import ERROR_FILE, METRICS_FILE, SUMMARY_FILE, history_from_metrics

__all__ = ["OVERRIDES_FILE", "SweepJob", "find_jobs", "load_job", "split_overrides"]

OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"

OK = "ok"
INTERRUPTED = "interrupted"
NO_SUMMARY = "no summary.json (failed or still running)"
FAILED = "failed"


@dataclass
class SweepJob:
    """One job of a sweep, as read from its folder."""

    name: str  # its folder relative to the sweep folder (Hydra's job number by default)
    path: Path
    overrides: list[str]
    summary: dict[str, Any] | None
    history: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None  # the first line of its error.txt, for a job that raised

    @property
    def status(self) -> str:
        # error.txt is the last owner's (each run that takes a folder deletes the one before):
        # a failed start, or a continued run that failed after an earlier one's summary.json
        if self.error is not None:
            return f"{FAILED}: {self.error}"
        if self.summary is None:
            return NO_SUMMARY
        # cut by a signal, mid-epoch ("interrupted") or at an epoch's end ("signal" alone)
        cut = self.summary.get("interrupted") or self.summary.get("signal")
        return INTERRUPTED if cut else OK


def _natural_key(text: str) -> list[Any]:
    """Sort key putting job 10 after job 9."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def find_jobs(sweep_dir: str | os.PathLike) -> list[Path]:
    """The job folders under `sweep_dir` (each holds `.hydra/overrides.yaml`), in job order."""
    root = Path(sweep_dir)
    if not root.is_dir():
        raise DataError(
            "no such sweep folder; pass sweep_dir=PATH, the hydra.sweep.dir of a multirun",
            path=str(root),
        )
    jobs = [p.parent.parent for p in root.rglob(str(OVERRIDES_FILE))]
    jobs = [j for j in jobs if j != root]
    return sorted(jobs, key=lambda j: _natural_key(j.relative_to(root).as_posix()))


def _read_overrides(path: Path) -> list[str]:
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as e:  # a YAML syntax error: name the file
        raise DataError(f"unreadable overrides ({type(e).__name__}: {e})", path=str(path)) from e
    if value is None:
        return []
    if not isinstance(value, list):
        raise DataError("expected a list of overrides", path=str(path))
    return [str(v) for v in value]


def load_job(path: str | os.PathLike, root: str | os.PathLike | None = None) -> SweepJob:
    """Read one job folder: its overrides, summary.json and per-epoch history."""
    path = Path(path)
    name = path.relative_to(root).as_posix() if root is not None else path.name
    overrides = _read_overrides(path / OVERRIDES_FILE)
    summary = None
    summary_path = path / SUMMARY_FILE
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text())
        except json.JSONDecodeError as e:
            raise DataError(f"not valid JSON ({e})", path=str(summary_path)) from e
    if summary is not None:
        history = [dict(h) for h in summary.get("history") or []]
    else:
        history = history_from_metrics(path / "csv" / METRICS_FILE)
    error = None
    if (path / ERROR_FILE).is_file():
        lines = (path / ERROR_FILE).read_text(errors="replace").strip().splitlines()
        error = lines[0] if lines else "(no message)"
    return SweepJob(
        name=name, path=path, overrides=overrides, summary=summary, history=history, error=error
    )


def split_overrides(jobs: Sequence[SweepJob]) -> tuple[list[str], list[list[str]]]:
    """(overrides every job shares, per job the overrides that tell it apart)."""
    if not jobs:
        return [], []
    common = [o for o in jobs[0].overrides if all(o in j.overrides for j in jobs[1:])]
    # A key with the same value everywhere is common; any other override of that job varies.
    return common, [[o for o in j.overrides if o not in common] for j in jobs]
