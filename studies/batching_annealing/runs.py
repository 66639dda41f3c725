"""The runs of a study folder, read back: each run's arm and the figures the study report needs.

A study folder (`python -m studies.batching_annealing.driver`, `experiment=multi30k_study`)
holds one training run folder per arm, `<study>/<arm>/`, each with `.hydra/` (its composed
config and overrides), `csv/metrics.csv` and, once finished, `summary.json`. Anything else in it
(logs, a code snapshot, `timing.json`) is not a run and is skipped: runs are the sub-folders that
hold `.hydra/overrides.yaml`, as for the sweep report (`convseq.evaluation.report.find_jobs`).

An arm is identified by what its composed config (`.hydra/config.yaml`) says, else by its
overrides: batching, annealing rule (with force's `anneal.force_anneal` epoch), optimiser,
momentum, lr and seed.

Seconds per epoch come from `timing.json` in the study folder when it lists the run (measured
apart, on a quiet machine; see `read_timing`), else from the run's own figures.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convseq.errors import DataError
from convseq.evaluation.history import as_float, best_of, finite_or_none
from convseq.evaluation.sweep_jobs import SweepJob, find_jobs, load_job

__all__ = [
    "TIMING_FILE",
    "Arm",
    "StudyRun",
    "anneal_start",
    "identify_arm",
    "load_study",
    "read_timing",
    "study_run",
]

TIMING_FILE = "timing.json"
CONFIG_FILE = Path(".hydra") / "config.yaml"

FINISHED = "finished"
INTERRUPTED = "interrupted (resume it)"
NO_SUMMARY = "running or failed (no summary.json)"


@dataclass(frozen=True)
class Arm:
    """What tells one arm of the study from another (`?` / NaN / None where unknown)."""

    batching: str  # tokens | sentences
    anneal: str  # plateau | lua | force | ...
    force_anneal: int | None  # anneal=force: the first annealed epoch
    optimizer: str  # nag | sgd | adam
    momentum: float
    lr: float
    seed: int | None

    @property
    def annealing(self) -> str:
        """The annealing rule, force with its epoch (``force@9``)."""
        if self.anneal == "force" and self.force_anneal is not None:
            return f"force@{self.force_anneal}"
        return self.anneal

    @property
    def optimiser(self) -> str:
        """E.g. ``NAG 0.99, lr 0.25`` or ``SGD 0, lr 25``."""
        return f"{self.optimizer.upper()} {self.momentum:g}, lr {self.lr:g}"

    @property
    def setting(self) -> tuple[str, float, float]:
        """(optimizer, momentum, lr): arms with the same setting differ only by the rules."""
        return self.optimizer, self.momentum, self.lr


@dataclass
class StudyRun:
    """One run folder of the study and the figures the report shows (NaN / None: unknown)."""

    name: str  # its folder, relative to the study folder
    path: Path
    arm: Arm
    status: str
    finished: bool  # summary.json written and not interrupted
    epochs: int  # trained (so far, for an unfinished run)
    seconds_per_epoch: float
    total_seconds: float
    time_source: str  # timing.json | summary.json | csv/metrics.csv
    epoch: list[int]  # per recorded epoch ...
    minutes: list[float | None]  # ... cumulative training minutes at its end
    lr: list[float | None]
    valid_bleu: list[float | None]
    anneal_start: int | None  # first epoch trained with an lr below the first epoch's
    best_bleu: float
    best_bleu_epoch: int | None
    test_bleu: float
    stop_reason: str
    stopped_by_rule: bool  # its lr fell below anneal.min_lr (not max_epochs, max_time, ...)
    hypotheses: Path | None  # generate-test.txt (best.ckpt's test translations), if any

    @property
    def complete(self) -> bool:
        """Finished by its own annealing rule: its epoch count is the arm's answer."""
        return self.finished and self.stopped_by_rule


# -- identification ------------------------------------------------------------------------------
def _load_config(path: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as e:  # a YAML syntax error: name the file
        raise DataError(f"unreadable run config ({type(e).__name__}: {e})", path=str(path)) from e
    if not isinstance(value, dict):
        raise DataError("expected a mapping (Hydra's composed config)", path=str(path))
    return value


def _from_overrides(overrides: list[str]) -> dict[str, str]:
    """``key=value`` overrides as a dict (``+``/``++`` prefixes dropped)."""
    out = {}
    for o in overrides:
        if "=" in o:
            key, value = o.split("=", 1)
            out[key.lstrip("+")] = value
    return out


def _int_or_none(value: Any) -> int | None:
    v = as_float(value)
    return int(v) if math.isfinite(v) else None


def identify_arm(run_dir: str | os.PathLike, overrides: list[str]) -> Arm:
    """The arm of a run folder: from `.hydra/config.yaml`, else from its overrides.

    Raises:
        DataError: config.yaml exists but is not readable YAML.
    """
    path = Path(run_dir) / CONFIG_FILE
    cfg = _load_config(path) if path.is_file() else {}
    ov = _from_overrides(overrides)

    def get(group: str, key: str, override: str) -> Any:
        node = cfg.get(group)
        if isinstance(node, dict) and key in node:
            return node[key]
        return ov.get(override)

    anneal = str(get("anneal", "name", "anneal") or "?")
    seed = cfg.get("seed", ov.get("seed"))
    return Arm(
        batching=str(get("batching", "name", "batching") or "?"),
        anneal=anneal,
        force_anneal=(
            _int_or_none(get("anneal", "force_anneal", "anneal.force_anneal"))
            if anneal == "force"
            else None
        ),
        optimizer=str(get("optim", "name", "optim") or "?"),
        momentum=as_float(get("optim", "momentum", "optim.momentum")),
        lr=as_float(get("optim", "lr", "optim.lr")),
        seed=_int_or_none(seed),
    )


# -- timing.json ---------------------------------------------------------------------------------
TIMING_KEYS = ("train_seconds_per_epoch", "valid_seconds_per_epoch")


def read_timing(study_dir: str | os.PathLike) -> dict[str, dict[str, float]]:
    """`<study>/timing.json`: per run folder, its training and validation seconds per epoch.

    The format: ``{"<run folder>": {"train_seconds_per_epoch": 80.1,
    "valid_seconds_per_epoch": 9.5}, ...}``, the run folder relative to the study folder (e.g.
    ``tok_plateau_s1``); keys that start with ``_`` (e.g. ``"_note": "medians of 3 epochs"``)
    are comments. Empty when the file does not exist.

    Raises:
        DataError: the file is not JSON, or an entry lacks a key or holds a negative number.
    """
    path = Path(study_dir) / TIMING_FILE
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"not valid JSON ({e})", path=str(path)) from e
    if not isinstance(record, dict):
        raise DataError('expected {"<run folder>": {...}, ...}', path=str(path))
    out = {}
    for name, entry in record.items():
        if name.startswith("_"):
            continue
        values = {
            k: as_float(entry.get(k)) if isinstance(entry, dict) else math.nan for k in TIMING_KEYS
        }
        bad = [k for k, v in values.items() if not (math.isfinite(v) and v >= 0)]
        if bad or values["train_seconds_per_epoch"] <= 0:
            raise DataError(
                f'entry "{name}" needs {TIMING_KEYS[0]} > 0 and {TIMING_KEYS[1]} >= 0 (seconds '
                f"per epoch, measured on a quiet machine); fix or remove it",
                path=str(path),
            )
        out[name] = values
    return out


# -- one run -------------------------------------------------------------------------------------
RULE_STOP = "fell below anneal.min_lr"  # in the stop reason of a run its annealing rule ended


def anneal_start(epochs: list[int], lrs: list[float | None]) -> int | None:
    """The first epoch trained with an lr below the first epoch's (None: it never fell)."""
    known = [(e, lr) for e, lr in zip(epochs, lrs) if lr is not None]
    if not known:
        return None
    first = known[0][1]
    return next((e for e, lr in known if lr < first * (1 - 1e-6)), None)


def _cumulative(seconds: list[float | None]) -> list[float | None]:
    out: list[float | None] = []
    total: float | None = 0.0
    for s in seconds:
        total = None if total is None or s is None else total + s / 60.0
        out.append(total)
    return out


def study_run(job: SweepJob, timing: Mapping[str, Mapping[str, float]] | None = None) -> StudyRun:
    """The study report's figures of one run folder (read by `convseq.evaluation.report.load_job`)."""
    summary = job.summary
    history = sorted((h for h in job.history if "epoch" in h), key=lambda h: int(h["epoch"]))
    epoch = [int(h["epoch"]) for h in history]
    lr = [finite_or_none(h, "train_epoch/lr") for h in history]
    finished = summary is not None and not summary.get("interrupted")
    status = FINISHED if finished else (INTERRUPTED if summary is not None else NO_SUMMARY)
    epochs = int(summary.get("epochs") or len(history)) if summary is not None else len(history)
    measured = (timing or {}).get(job.name)
    if measured is not None:
        per_epoch = measured[TIMING_KEYS[0]] + measured[TIMING_KEYS[1]]
        total, source = epochs * per_epoch, TIMING_FILE
        minutes: list[float | None] = [e * per_epoch / 60.0 for e in epoch]
    else:
        seconds = [finite_or_none(h, "train_epoch/time") for h in history]
        minutes = _cumulative(seconds)
        if summary is not None:
            total, source = as_float(summary.get("train_seconds")), "summary.json"
            per_epoch = as_float(summary.get("seconds_per_epoch"))
        else:
            known = [s for s in seconds if s is not None]
            total, source = (math.fsum(known) if known else math.nan), "csv/metrics.csv"
            per_epoch = total / epochs if epochs else math.nan
    best, best_epoch = best_of(history, "valid/bleu", maximize=True)
    reason = str((summary or {}).get("stop_reason") or "")
    hypotheses = job.path / "generate-test.txt"
    return StudyRun(
        name=job.name,
        path=job.path,
        arm=identify_arm(job.path, job.overrides),
        status=status,
        finished=finished,
        epochs=epochs,
        seconds_per_epoch=per_epoch,
        total_seconds=total,
        time_source=source,
        epoch=epoch,
        minutes=minutes,
        lr=lr,
        valid_bleu=[finite_or_none(h, "valid/bleu") for h in history],
        anneal_start=anneal_start(epoch, lr),
        best_bleu=best,
        best_bleu_epoch=best_epoch,
        test_bleu=as_float(((summary or {}).get("test") or {}).get("test/bleu")),
        stop_reason=reason,
        stopped_by_rule=finished and RULE_STOP in reason,
        hypotheses=hypotheses if finished and hypotheses.is_file() else None,
    )


def load_study(study_dir: str | os.PathLike) -> tuple[list[StudyRun], list[str]]:
    """(the study's runs, in folder order; notes on what was skipped or not used).

    Raises:
        DataError: no such folder, no run in it, or an unreadable run file or timing.json.
    """
    root = Path(study_dir)
    paths = find_jobs(root)  # raises for a missing folder
    if not paths:
        raise DataError(
            "no run folders (sub-folders with .hydra/overrides.yaml) found; pass the study's "
            "folder (the driver's --root, default outputs/study)",
            path=str(root),
        )
    timing = read_timing(root)
    runs = [study_run(load_job(p, root), timing) for p in paths]
    notes = []
    names = {r.name for r in runs}
    for name in sorted(set(timing) - names):
        notes.append(f"{TIMING_FILE}: {name!r} names no run folder of the study; ignored")
    return runs, notes
