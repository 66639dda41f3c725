"""A run's history on disk, read back: metrics.csv rows and summary.json's per-epoch records.

A training run folder holds ``csv/metrics.csv`` (written as it goes, by
`convseq.training.run_log`) and, once it finished, ``summary.json`` with its per-epoch
``history``. Reports, curves and comparisons read runs through these functions, so a run still in
progress (or one that died) is read from metrics.csv as far as it goes.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

from convseq.common.run_record import ERROR_FILE as ERROR_FILE  # read here by the reports
from convseq.errors import DataError

METRICS_FILE = "metrics.csv"  # under <run>/csv/
SUMMARY_FILE = "summary.json"  # in <run>/
# ERROR_FILE: in <run>/ of a run or sweep job that raised, its one-line error (run_record)


def read_metrics(path: str | os.PathLike) -> list[dict[str, float]]:
    """metrics.csv as a list of rows {column: float}, empty cells left out."""
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out.append({k: float(v) for k, v in row.items() if v not in ("", None)})
    return out


def history_from_metrics(path: Path) -> list[dict[str, Any]]:
    """Per-epoch records rebuilt from metrics.csv (for a job that left no summary.json)."""
    if not path.is_file():
        return []
    by_epoch: dict[int, dict[str, Any]] = {}
    for row in read_metrics(path):
        if "epoch" not in row or not any(k.startswith(("valid/", "train_epoch/")) for k in row):
            continue
        epoch = int(row["epoch"]) + 1  # Lightning's epochs are 0-based, the report's 1-based
        entry = by_epoch.setdefault(epoch, {"epoch": epoch})
        entry.update({k: v for k, v in row.items() if k.startswith(("valid/", "train_epoch/"))})
    return [by_epoch[e] for e in sorted(by_epoch)]


def load_history(run_dir: str | os.PathLike) -> tuple[list[dict[str, Any]], str]:
    """The per-epoch records of a run folder, and the file they came from.

    summary.json's ``history`` when the run finished; else rebuilt from csv/metrics.csv.

    Raises:
        DataError: no such folder, neither file in it, or summary.json is not valid JSON.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise DataError("no such run folder", path=str(root))
    summary = root / SUMMARY_FILE
    if summary.is_file():
        try:
            record = json.loads(summary.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataError(f"not valid JSON ({e})", path=str(summary)) from e
        history = record.get("history") if isinstance(record, dict) else None
        if not isinstance(history, list):
            raise DataError(
                "no 'history' list in it; is this a training run's summary.json?", str(summary)
            )
        return [dict(h) for h in history if isinstance(h, dict)], SUMMARY_FILE
    metrics = root / "csv" / METRICS_FILE
    if metrics.is_file():
        return history_from_metrics(metrics), f"csv/{METRICS_FILE}"
    raise DataError(
        f"neither {SUMMARY_FILE} nor csv/{METRICS_FILE} here: pass a training run folder "
        "(paths.output_dir of task=train); for a sweep folder use task=report sweep_dir=...",
        path=str(root),
    )


def as_float(value: Any) -> float:
    """A float from a JSON value (None and strings such as "inf" included); NaN if none."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def finite_or_none(record: dict[str, Any], key: str) -> float | None:
    """`record[key]` as a float, or None where it is missing or not finite (a gap in a curve)."""
    v = as_float(record.get(key))
    return v if math.isfinite(v) else None


def best_of(history: list[dict[str, Any]], key: str, maximize: bool) -> tuple[float, int | None]:
    """The best finite value of `key` over the epochs and its (1-based) epoch; (NaN, None) if none."""
    found = [(as_float(h.get(key)), int(h["epoch"])) for h in history if "epoch" in h]
    found = [f for f in found if math.isfinite(f[0])]
    if not found:
        return math.nan, None
    return (max if maximize else min)(found, key=lambda f: f[0])


def minutes_to_scores(
    validations: list[dict[str, Any]], key: str = "valid/bleu"
) -> dict[int, float]:
    """{n: minutes} for every whole number n from 1 up to the best `key`: the command's wall
    minutes at the first validation whose `key` reached n (validations without minutes or
    without the score are passed over)."""
    out: dict[int, float] = {}
    for v in validations:
        score, minutes = v.get(key), v.get("minutes")
        if not isinstance(score, (int, float)) or not isinstance(minutes, (int, float)):
            continue
        if not math.isfinite(score):
            continue
        for n in range(1, int(math.floor(score)) + 1):
            out.setdefault(n, float(minutes))
    return dict(sorted(out.items()))


def time_to_quality_line(reached: dict[int, float], name: str = "valid BLEU") -> str | None:
    """`valid BLEU first reached <=20 at 1.4, 21-24 at 2.0, 25 at 2.6 min (...)`: the whole
    numbers reached at the same validation grouped (the first group holds every lower number);
    None when nothing was reached."""
    if not reached:
        return None
    groups: list[list[int]] = []
    for n in sorted(reached):
        if groups and reached[groups[-1][-1]] == reached[n]:
            groups[-1].append(n)
        else:
            groups.append([n])
    parts = []
    for i, g in enumerate(groups):
        if i == 0 and g[-1] > 1:
            label = f"<={g[-1]}"
        else:
            label = str(g[0]) if len(g) == 1 else f"{g[0]}-{g[-1]}"
        parts.append(f"{label} at {reached[g[0]]:.1f}")
    return f"{name} first reached " + ", ".join(parts) + " min (since the command started)"
