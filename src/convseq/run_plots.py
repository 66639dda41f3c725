"""Curves of one or more training runs in one PNG: valid BLEU vs minutes, valid loss, lr.

A training run folder (``paths.output_dir`` of ``python run.py task=train``) holds
``summary.json`` once training finished, with its per-epoch ``history``; a run still in progress
(or one that died) has only ``csv/metrics.csv``, from which the same per-epoch records are
rebuilt (as the sweep report does). For a whole sweep, ``task=report`` draws
``sweep_curves.png`` instead.

The three panels:

- validation BLEU against cumulative training minutes (the sum of the epochs'
  ``train_epoch/time``), with a vertical line at ``--mark-minutes`` (a time budget);
- validation loss against the epoch;
- the lr of each epoch (at its start), on a log axis.

CLI::

    python -m convseq.run_plots outputs/a outputs/b --out curves.png --mark-minutes 45

The run folders are only read; the PNG goes where ``--out`` says.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from convseq.errors import DataError
from convseq.plots import finite_points
from convseq.report import finite_or_none, history_from_metrics
from convseq.run_log import METRICS_FILE, SUMMARY_FILE

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["RunCurves", "draw_runs", "load_history", "main", "plot_runs", "run_curves"]


@dataclass
class RunCurves:
    """The plotted numbers of one run, one entry per epoch (None where an epoch has no value)."""

    label: str
    path: Path
    source: str  # the file the history came from: summary.json or csv/metrics.csv
    epoch: list[int]
    minutes: list[float | None]  # cumulative training minutes at the end of each epoch
    valid_bleu: list[float | None]
    valid_loss: list[float | None]
    lr: list[float | None]

    def best_bleu(self, within_minutes: float | None = None) -> tuple[float, int | None]:
        """(best valid BLEU, its epoch), over the epochs that ended by `within_minutes` if given."""
        best, at = math.nan, None
        for e, m, b in zip(self.epoch, self.minutes, self.valid_bleu):
            if b is None or (within_minutes is not None and (m is None or m > within_minutes)):
                continue
            if at is None or b > best:
                best, at = b, e
        return best, at


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


def run_curves(run_dir: str | os.PathLike, label: str | None = None) -> RunCurves:
    """The plotted numbers of one run folder (see `load_history` for where they come from)."""
    history, source = load_history(run_dir)
    history = sorted((h for h in history if "epoch" in h), key=lambda h: int(h["epoch"]))
    minutes: list[float | None] = []
    total: float | None = 0.0
    for h in history:
        seconds = finite_or_none(h, "train_epoch/time")
        # once an epoch's time is unknown, so is every later epoch's end
        total = None if total is None or seconds is None else total + seconds / 60.0
        minutes.append(total)
    return RunCurves(
        label=label if label is not None else str(run_dir),
        path=Path(run_dir),
        source=source,
        epoch=[int(h["epoch"]) for h in history],
        minutes=minutes,
        valid_bleu=[finite_or_none(h, "valid/bleu") for h in history],
        valid_loss=[finite_or_none(h, "valid/loss") for h in history],
        lr=[finite_or_none(h, "train_epoch/lr") for h in history],
    )


def draw_runs(
    curves: Sequence[RunCurves], mark_minutes: float | None = None, title: str = ""
) -> Figure:
    """A matplotlib Figure (Agg canvas) with the three panels; one line per run in each.

    Lines are drawn in run order, one per run and panel, so ``ax.lines[i]`` is run ``i``'s;
    the mark is an extra, last line of the BLEU panel.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.4), dpi=100)
    FigureCanvasAgg(fig)
    ax_bleu, ax_loss, ax_lr = fig.subplots(1, 3)
    any_lr = False
    for c in curves:
        x, y = finite_points(c.minutes, c.valid_bleu)
        (line,) = ax_bleu.plot(x, y, marker="o", markersize=3, label=c.label)
        color = line.get_color()  # the same run has the same color in every panel
        x, y = finite_points(c.epoch, c.valid_loss)
        ax_loss.plot(x, y, marker="o", markersize=3, color=color)
        x, y = finite_points(c.epoch, c.lr)
        positive = [(a, b) for a, b in zip(x, y) if b > 0]  # a log axis cannot show lr <= 0
        any_lr = any_lr or bool(positive)
        xs, ys = [a for a, _ in positive], [b for _, b in positive]
        ax_lr.plot(xs, ys, marker="o", markersize=3, color=color)
    if mark_minutes is not None:
        ax_bleu.axvline(mark_minutes, color="0.4", linestyle="--", linewidth=1)
        ax_bleu.text(
            mark_minutes, 0.02, f" {mark_minutes:g} min", transform=ax_bleu.get_xaxis_transform()
        )
    ax_bleu.set(xlabel="training minutes (cumulative)", ylabel="BLEU", title="validation BLEU")
    ax_loss.set(xlabel="epoch", ylabel="validation loss (bits/token)", title="validation loss")
    ax_lr.set(xlabel="epoch", ylabel="learning rate", title="learning rate (start of epoch)")
    if any_lr:
        ax_lr.set_yscale("log")  # annealing multiplies lr: equal steps on a log axis
    for ax in (ax_bleu, ax_loss, ax_lr):
        ax.grid(True, alpha=0.3)
    for ax in (ax_loss, ax_lr):
        ax.xaxis.get_major_locator().set_params(integer=True)
    if curves:
        ax_bleu.legend(fontsize="small", loc="best")
    if title:
        fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return fig


def plot_runs(
    curves: Sequence[RunCurves],
    path: str | os.PathLike,
    mark_minutes: float | None = None,
    title: str = "",
) -> Path:
    """Write `draw_runs`'s figure as a PNG (atomically; its folder is created). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = draw_runs(curves, mark_minutes, title)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path


def _summary_line(c: RunCurves, mark_minutes: float | None) -> str:
    known = [m for m in c.minutes if m is not None]
    minutes = f"{known[-1]:.1f} min" if known and c.minutes[-1] is not None else "? min"
    best, at = c.best_bleu()
    text = f"{c.label}: {len(c.epoch)} epochs, {minutes} (from {c.source})"
    text += f", best valid BLEU {best:.2f} (epoch {at})" if at is not None else ", no valid BLEU"
    if mark_minutes is not None:
        best, at = c.best_bleu(mark_minutes)
        by = f"{best:.2f} (epoch {at})" if at is not None else "none"
        text += f", by {mark_minutes:g} min {by}"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m convseq.run_plots RUN_DIR [RUN_DIR...] --out curves.png``."""
    parser = argparse.ArgumentParser(
        prog="python -m convseq.run_plots",
        description="Plot training run folders: valid BLEU vs minutes, valid loss, lr per epoch.",
    )
    parser.add_argument("runs", nargs="+", help="training run folders (summary.json or csv/)")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--mark-minutes", type=float, default=None, help="a vertical line at M")
    parser.add_argument("--title", default="", help="a line above the panels")
    args = parser.parse_args(argv)
    try:
        curves = [run_curves(r) for r in args.runs]
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = plot_runs(curves, args.out, args.mark_minutes, args.title)
    for c in curves:
        print(_summary_line(c, args.mark_minutes))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
