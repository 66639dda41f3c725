"""Curves of training runs read from their folders, and the command that plots them.

A training run folder (``paths.output_dir`` of ``python run.py task=train``) holds
``summary.json`` once training finished, with its per-epoch ``history``; a run still in progress
(or one that died) has only ``csv/metrics.csv``, from which the same per-epoch records are
rebuilt (as the sweep report does). For a whole sweep, ``task=report`` draws
``sweep_curves.png`` instead.

The three panels (drawn by `convseq.viz.runs`):

- validation BLEU against cumulative training minutes (the sum of the epochs'
  ``train_epoch/time``), with a vertical line at ``--mark-minutes`` (a time budget);
- validation loss against the epoch;
- the lr of each epoch (at its start), on a log axis.

CLI::

    python -m convseq.evaluation.run_curves outputs/a outputs/b --out curves.png --mark-minutes 45

The run folders are only read; the PNG goes where ``--out`` says.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from convseq.errors import DataError
from convseq.evaluation.history import finite_or_none, load_history
from convseq.viz.runs import RunCurves, draw_runs, plot_runs

__all__ = ["RunCurves", "draw_runs", "load_history", "main", "plot_runs", "run_curves"]


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
    """``python -m convseq.evaluation.run_curves RUN_DIR [RUN_DIR...] --out curves.png``."""
    parser = argparse.ArgumentParser(
        prog="python -m convseq.evaluation.run_curves",
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
