"""The summary of a sweep: one row per job, as a markdown table, a CSV and a PNG of the curves.

A Hydra multirun (`python run.py -m optim=nag,sgd anneal=plateau,force`) leaves one folder per
job under `hydra.sweep.dir`, each with `.hydra/overrides.yaml` and, once train() finished,
`summary.json` (see `convseq.tasks.train`). `write_report(sweep_dir)` reads them and writes, into the
sweep folder:

- `sweep_report.md` and `sweep_report.csv`: per job the overrides, total training wall time,
  epochs run, time per epoch, why it stopped, the best validation loss and its epoch, the best
  validation BLEU when the runs computed one, the last lr, and test figures only when asked
  (`test=True`: tuning happens on the validation set);
- `sweep_curves.png`: validation loss and lr against the epoch, one line per job;
- `sweep_report.json`: the same rows and the plotted numbers, for scripts and notebooks.

A job is read by `convseq.evaluation.sweep_jobs`. One without `summary.json` (it failed, or is
still running) is listed from its `csv/metrics.csv` as far as that goes, with its status saying
so: `failed: <error>` when the job left its error in `error.txt` (a sweep job or a run that
raised in its own folder; also over an earlier run's summary.json, for a `resume=` that
failed), else `no summary.json (failed or still running)`.

An Optuna search (`convseq.evaluation.search_report`) gets the same files, its rows ordered by
the objective (best first, with an objective column), a paragraph naming the best trial and its
overrides, the keys `search` and `best` in the JSON, and `best_trial.yaml`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from convseq.errors import DataError
from convseq.evaluation.history import (
    as_float,
    best_of,
    finite_or_none,
    minutes_to_scores,
)
from convseq.evaluation.search_report import (
    BEST_FILE,
    best_trial,
    best_yaml,
    markdown_lines,
    optuna_search,
    rank_rows,
)
from convseq.evaluation.sweep_jobs import (
    OVERRIDES_FILE,
    SweepJob,
    find_jobs,
    load_job,
    split_overrides,
)
from convseq.viz.curves import plot_curves

__all__ = ["REPORT_FILES", "sweep_rows", "write_report"]

REPORT_FILES = {
    "markdown": "sweep_report.md",
    "csv": "sweep_report.csv",
    "json": "sweep_report.json",
    "png": "sweep_curves.png",
}


def _bleu_key(record: dict[str, Any], prefix: str) -> str | None:
    """The BLEU column of `record` (e.g. valid/bleu), if the runs computed one."""
    for key in (f"{prefix}/bleu", f"{prefix}/BLEU", f"{prefix}/sacrebleu"):
        if key in record:
            return key
    return None


def _epochs_run(summary: dict[str, Any]) -> float | int:
    """Epochs a run trained: a partial last epoch as a fraction (summary.json's epochs_trained,
    e.g. 1.39), whole epochs as a whole number; older summaries: their `epochs`."""
    trained = summary.get("epochs_trained")
    if isinstance(trained, (int, float)) and not float(trained).is_integer():
        return round(float(trained), 2)
    return int(trained if isinstance(trained, (int, float)) else summary.get("epochs") or 0)


def job_row(job: SweepJob, varying: list[str], test: bool = False) -> dict[str, Any]:
    """The report's row of one job (numbers as floats, NaN where unknown)."""
    s = job.summary or {}
    h = job.history
    best_loss, best_epoch = best_of(h, "valid/loss", maximize=False)
    bleu_key = next((k for k in (_bleu_key(e, "valid") for e in h) if k), None)
    best_bleu, bleu_epoch = best_of(h, bleu_key, maximize=True) if bleu_key else (math.nan, None)
    if job.summary is not None:
        epochs = _epochs_run(s)
        wall = as_float(s.get("train_seconds"))
        per_epoch = as_float(s.get("seconds_per_epoch"))
        updates = int(s["updates"]) if isinstance(s.get("updates"), (int, float)) else math.nan
        reason = str(s.get("stop_reason") or "")
    else:  # from metrics.csv: what the job managed before it stopped
        epochs = len(h)
        wall = sum(as_float(e.get("train_epoch/time")) for e in h) if h else math.nan
        per_epoch = wall / epochs if epochs else math.nan
        updates, reason = math.nan, ""
    lrs = [as_float(e.get("train_epoch/lr")) for e in h]
    row: dict[str, Any] = {
        "job": job.name,
        "overrides": " ".join(varying),
        "status": job.status,
        "epochs": epochs,
        "updates": updates,
        "wall_seconds": wall,
        "seconds_per_epoch": per_epoch,
        "stop_reason": reason,
        "best_valid_loss": best_loss,
        "best_valid_epoch": best_epoch,
        "best_valid_bleu": best_bleu,
        "best_bleu_epoch": bleu_epoch,
        "last_lr": lrs[-1] if lrs else math.nan,
        # whole number -> the command's minutes when valid BLEU first reached it
        "minutes_to_valid_bleu": _minutes_to_bleu(s),
        "all_overrides": " ".join(job.overrides),
    }
    if test:
        figures = s.get("test") or {}
        row["test_loss"] = as_float(figures.get("test/loss"))
        row["test_ppl"] = as_float(figures.get("test/ppl"))
        key = _bleu_key(figures, "test")
        row["test_bleu"] = as_float(figures.get(key)) if key else math.nan
    return row


def _minutes_to_bleu(summary: dict[str, Any]) -> dict[int, float]:
    """summary.json's `minutes_to_valid_bleu` (or its validations', for a run that finished
    before the key existed), with whole-number keys."""
    stored = summary.get("minutes_to_valid_bleu")
    if isinstance(stored, dict):
        return {int(n): float(m) for n, m in stored.items()}
    return minutes_to_scores(list(summary.get("validations") or []))


def time_to_bleu_columns(rows: list[dict[str, Any]], count: int = 3) -> list[int]:
    """The whole numbers of the report's time-to-BLEU columns: the `count` highest that some
    job's valid BLEU reached (the sweep's best reached all of them)."""
    reached = {n for r in rows for n in (r.get("minutes_to_valid_bleu") or {})}
    return sorted(reached)[-count:]


def job_curve(job: SweepJob, label: str) -> dict[str, Any]:
    """The plotted numbers of one job: per epoch, the validation loss and the lr; per
    validation (every validation, also those inside epochs), its update count, loss and lr."""
    epochs = [e for e in job.history if "epoch" in e]
    validations = list((job.summary or {}).get("validations") or [])
    if not validations:  # an older run, or one still in progress: its epochs' validations
        validations = [
            {
                "updates": e.get("updates"),
                "valid/loss": e.get("valid/loss"),
                "lr": e.get("train_epoch/lr"),
            }
            for e in epochs
        ]
    return {
        "job": job.name,
        "label": label,
        "epoch": [int(e["epoch"]) for e in epochs],
        "valid_loss": [finite_or_none(e, "valid/loss") for e in epochs],
        "lr": [finite_or_none(e, "train_epoch/lr") for e in epochs],
        "validation_updates": [finite_or_none(v, "updates") for v in validations],
        "validation_loss": [finite_or_none(v, "valid/loss") for v in validations],
        "validation_lr": [finite_or_none(v, "lr") for v in validations],
    }


def sweep_rows(
    sweep_dir: str | os.PathLike, test: bool = False
) -> tuple[list[SweepJob], list[str], list[dict[str, Any]]]:
    """(jobs, overrides common to all jobs, one row per job) of the sweep in `sweep_dir`."""
    root = Path(sweep_dir)
    jobs = [load_job(p, root) for p in find_jobs(root)]
    if not jobs:
        raise DataError(
            f"no job folders (with {OVERRIDES_FILE}) found; is this the hydra.sweep.dir of a "
            "multirun (`python run.py -m ...`)?",
            path=str(root),
        )
    common, varying = split_overrides(jobs)
    return jobs, common, [job_row(j, v, test) for j, v in zip(jobs, varying)]


# -- formatting ---------------------------------------------------------------------------------
def _hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "n/a"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _f(x: Any, digits: int = 4) -> str:
    v = as_float(x)
    return "n/a" if not math.isfinite(v) else f"{v:.{digits}f}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _columns(rows: list[dict[str, Any]], test: bool) -> tuple[bool, bool]:
    """Whether the BLEU columns have anything to show."""
    has_valid_bleu = any(math.isfinite(as_float(r["best_valid_bleu"])) for r in rows)
    has_test_bleu = test and any(math.isfinite(as_float(r.get("test_bleu"))) for r in rows)
    return has_valid_bleu, has_test_bleu


def to_markdown(
    root: Path,
    common: list[str],
    rows: list[dict[str, Any]],
    test: bool,
    png: str | None,
    search: list[str] | None = None,
    objective: str | None = None,
) -> str:
    """The report as a markdown document (a heading, the common overrides, the table, the PNG).

    A search's report adds `search` (its paragraph, before the table) and an `objective`
    column (its title; the rows' `objective` values) after the job.
    """
    valid_bleu, test_bleu = _columns(rows, test)
    head = ["job"] + ([objective] if objective else [])
    head += ["overrides", "wall time", "epochs", "s/epoch", "stop reason"]
    head += ["best valid loss (epoch)"] + (["best valid BLEU (epoch)"] if valid_bleu else [])
    to_bleu = time_to_bleu_columns(rows) if valid_bleu else []
    head += [f"min to valid BLEU {n}" for n in to_bleu]
    head += ["last lr", "status"]
    if test:
        head += ["test loss"] + (["test BLEU"] if test_bleu else [])
    lines = [
        f"# Sweep report: {root}",
        "",
        f"{len(rows)} jobs. Overrides common to every job: "
        + (" ".join(f"`{o}`" for o in common) if common else "none")
        + ". Losses in bits per token; wall time is the training time (validation included)"
        + (
            "; min to valid BLEU n: the command's minutes (start-up included) when valid BLEU "
            "first reached n (- never)."
            if to_bleu
            else "."
        ),
        "",
        *(search or []),
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for r in rows:
        cells = _row_cells(r, bool(objective), valid_bleu, to_bleu, test, test_bleu)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if png:
        lines += ["", f"![validation loss and lr per epoch]({png})"]
    return "\n".join(lines) + "\n"


def _row_cells(
    r: dict[str, Any],
    objective: bool,
    valid_bleu: bool,
    to_bleu: list[int],
    test: bool,
    test_bleu: bool,
) -> list[str]:
    """One job's cells of `to_markdown`'s table, in the order of its head."""
    cells = [r["job"]] + ([_f(r["objective"])] if objective else [])
    cells += [
        r["overrides"] or "(none)",
        _hms(r["wall_seconds"]),
        str(r["epochs"]),
        _f(r["seconds_per_epoch"], 1),
        r["stop_reason"] or "n/a",
        f"{_f(r['best_valid_loss'])} ({r['best_valid_epoch'] or 'n/a'})",
    ]
    if valid_bleu:
        cells.append(f"{_f(r['best_valid_bleu'], 2)} ({r['best_bleu_epoch'] or 'n/a'})")
    reached = r.get("minutes_to_valid_bleu") or {}
    cells += [f"{reached[n]:.1f}" if n in reached else "-" for n in to_bleu]
    cells += [f"{as_float(r['last_lr']):.3g}", r["status"]]
    if test:
        cells.append(_f(r["test_loss"]))
        if test_bleu:
            cells.append(_f(r["test_bleu"], 2))
    return cells


def to_csv(rows: list[dict[str, Any]]) -> str:
    """The rows as CSV (NaN as an empty cell)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: _csv_value(v) for k, v in r.items()})
    return buf.getvalue()


def _csv_value(value: Any) -> Any:
    """NaN as an empty cell, a mapping as JSON (`{"40": 12.5}`)."""
    if isinstance(value, float) and math.isnan(value):
        return ""
    if isinstance(value, dict):
        return json.dumps({str(k): v for k, v in value.items()})
    return value


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_report(
    sweep_dir: str | os.PathLike,
    test: bool = False,
    plot: bool = True,
    output_dir: str | os.PathLike | None = None,
    x: str = "epoch",
) -> dict[str, Path]:
    """Write the sweep's table (markdown, CSV, JSON) and curves (PNG); see the module docstring.

    Args:
        sweep_dir: the multirun folder (`hydra.sweep.dir`).
        test: also list the test figures (off by default: choose settings on validation).
        plot: write the PNG.
        output_dir: where to write the files (default: `sweep_dir`).
        x: what the curves are drawn against: ``epoch``, or ``updates`` (every validation at
            its update count: runs with validate_interval_updates).

    Returns:
        The files written, by kind ("markdown", "csv", "json", "png"; "best" for an Optuna
        search with a finished trial: best_trial.yaml).

    Raises:
        DataError: no such folder, no job in it, or an unreadable job file.
    """
    root = Path(sweep_dir).absolute()
    jobs, common, rows = sweep_rows(root, test)
    search = optuna_search(jobs)
    best = None
    if search is not None:  # trials best first
        jobs, rows = rank_rows(jobs, rows, search)
        best = best_trial(jobs, rows, search)
    out = Path(output_dir).absolute() if output_dir is not None else root
    out.mkdir(parents=True, exist_ok=True)
    files = {kind: out / name for kind, name in REPORT_FILES.items()}
    curves = [job_curve(j, f"{r['job']}: {r['overrides'] or '(none)'}") for j, r in zip(jobs, rows)]
    if plot:
        plot_curves(curves, files["png"], title=f"{root.name}: {len(jobs)} jobs", x=x)
    else:
        files.pop("png")
    png = REPORT_FILES["png"] if plot else None
    intro = markdown_lines(search, best, len(rows)) if search else None
    title = f"{search.metric} ({search.direction})" if search else None
    _write(files["markdown"], to_markdown(root, common, rows, test, png, intro, title))
    _write(files["csv"], to_csv(rows))
    record = {"sweep_dir": str(root), "common_overrides": common, "rows": rows, "curves": curves}
    if search is not None:
        record.update(search=asdict(search), best=best)
        if best is not None:
            files["best"] = out / BEST_FILE
            _write(files["best"], best_yaml(best))
    _write(files["json"], json.dumps(_json_value(record), indent=2) + "\n")
    return files
