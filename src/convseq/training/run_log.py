"""A run's logs on disk: one metrics.csv that a resumed run appends to, and summary.json.

Lightning's CSVLogger deletes an existing metrics.csv when a new Trainer opens its folder, so a
resumed run would lose the epochs before the interruption (or, with a fresh version folder,
split them over several files). `AppendingCSVLogger` keeps `<output_dir>/csv/metrics.csv`
whole: it reopens it, keeps its columns, and on resume first drops the rows a crashed process
may have written after its last checkpoint.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

from lightning_fabric.loggers.csv_logs import _ExperimentWriter
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.loggers.logger import rank_zero_experiment

from convseq.evaluation.history import METRICS_FILE


class _AppendingWriter(_ExperimentWriter):
    """Lightning's CSV writer, minus the deletion of an existing metrics file."""

    def __init__(self, log_dir: str) -> None:
        self.metrics: list[dict[str, float]] = []
        self.metrics_keys: list[str] = []
        self.log_dir = log_dir
        self.metrics_file_path = os.path.join(log_dir, METRICS_FILE)
        os.makedirs(log_dir, exist_ok=True)
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as f:
                header = next(csv.reader(f), [])
            self.metrics_keys = sorted(header)

    def log_hparams(self, params: dict[str, Any]) -> None:
        """Hyperparameters live in the run's .hydra/config.yaml; nothing to write here."""

    def save(self) -> None:
        if not self.metrics:
            return
        new_keys = self._record_new_keys()
        exists = os.path.isfile(self.metrics_file_path)
        if new_keys and exists:
            self._rewrite_with_new_header(self.metrics_keys)
        with open(self.metrics_file_path, "a" if exists else "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
            if not exists:
                writer.writeheader()
            writer.writerows(self.metrics)
        self.metrics = []

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        with open(self.metrics_file_path, newline="") as f:
            rows = list(csv.DictReader(f))
        with open(self.metrics_file_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fieldnames)
            writer.writeheader()
            writer.writerows(rows)


class AppendingCSVLogger(CSVLogger):
    """CSV metrics in `<save_dir>/csv/metrics.csv`, continued (not replaced) by a resumed run."""

    def __init__(self, save_dir: str, flush_logs_every_n_steps: int = 100):
        super().__init__(
            save_dir, name="", version="csv", flush_logs_every_n_steps=flush_logs_every_n_steps
        )

    @property
    @rank_zero_experiment
    def experiment(self) -> _AppendingWriter:
        if self._experiment is None:
            self._experiment = _AppendingWriter(self.log_dir)
        return self._experiment

    def log_hyperparams(self, params: Any = None) -> None:
        """Not written: the composed config is in the run's .hydra folder."""

    @property
    def metrics_file(self) -> Path:
        return Path(self.log_dir) / METRICS_FILE


def truncate_metrics(path: str | os.PathLike, last_step: int) -> int:
    """Drop rows logged after `last_step` (by a process that died after its last checkpoint).

    Returns:
        The number of rows dropped.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or [])
        rows = list(reader)
    keep = [r for r in rows if not r.get("step") or int(float(r["step"])) <= last_step]
    if len(keep) == len(rows):
        return 0
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(keep)
    os.replace(tmp, path)
    return len(rows) - len(keep)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_summary(path: str | os.PathLike, summary: dict[str, Any]) -> None:
    """Write `summary` as JSON (NaN as null), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(_json_safe(summary), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
