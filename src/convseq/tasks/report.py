"""`task=report`: the table and curves of a sweep.

    python run.py task=report sweep_dir=multirun/2026-12-03/10-00-00 [report.test=true]

A multirun writes the sweep report itself when it ends (`convseq.cli.hydra_callbacks`); this
task re-makes it, e.g. for a sweep that is still running or was interrupted
(`convseq.evaluation.report`). A study's own report (one run folder per arm) is the study's
command, not this task's: see studies/README.md.
"""

from __future__ import annotations

from pathlib import Path

from convseq.errors import DataError
from convseq.evaluation.report import write_report
from convseq.tasks.config import ReportTaskConfig

__all__ = ["run_report"]


def run_report(cfg: ReportTaskConfig) -> dict[str, Path]:
    """Summarise the multirun in `sweep_dir`; print it."""
    if not cfg.sweep_dir:
        raise DataError(
            "task=report needs sweep_dir=PATH: the folder of a multirun (its hydra.sweep.dir)"
        )
    files = write_report(cfg.sweep_dir, test=cfg.report.test, x=cfg.report.x)
    print(files["markdown"].read_text(), end="")
    print(f"convseq: sweep report written: {', '.join(str(p) for p in files.values())}")
    return files
