"""Curves of one or more training runs in one figure: valid BLEU vs minutes, valid loss, lr.

The three panels:

- validation BLEU against cumulative training minutes (the sum of the epochs'
  ``train_epoch/time``), with a vertical line at ``mark_minutes`` (a time budget);
- validation loss against the epoch;
- the lr of each epoch (at its start), on a log axis.

`RunCurves` holds the plotted numbers of one run; `convseq.evaluation.run_curves` reads them
from run folders (and is the command line, ``python -m convseq.evaluation.run_curves``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from convseq.viz.canvas import finish_figure, label_epoch_panels, new_figure, plot_lr, save_png
from convseq.viz.curves import finite_points

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["RunCurves", "draw_runs", "plot_runs"]


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


def draw_runs(
    curves: Sequence[RunCurves], mark_minutes: float | None = None, title: str = ""
) -> Figure:
    """A matplotlib Figure (Agg canvas) with the three panels; one line per run in each.

    Lines are drawn in run order, one per run and panel, so ``ax.lines[i]`` is run ``i``'s;
    the mark is an extra, last line of the BLEU panel.
    """
    fig = new_figure(15, 4.4)
    ax_bleu, ax_loss, ax_lr = fig.subplots(1, 3)
    any_lr = False
    for c in curves:
        x, y = finite_points(c.minutes, c.valid_bleu)
        (line,) = ax_bleu.plot(x, y, marker="o", markersize=3, label=c.label)
        color = line.get_color()  # the same run has the same color in every panel
        x, y = finite_points(c.epoch, c.valid_loss)
        ax_loss.plot(x, y, marker="o", markersize=3, color=color)
        drawn = plot_lr(ax_lr, *finite_points(c.epoch, c.lr), color=color)
        any_lr = any_lr or drawn
    if mark_minutes is not None:
        ax_bleu.axvline(mark_minutes, color="0.4", linestyle="--", linewidth=1)
        ax_bleu.text(
            mark_minutes, 0.02, f" {mark_minutes:g} min", transform=ax_bleu.get_xaxis_transform()
        )
    ax_bleu.set(xlabel="training minutes (cumulative)", ylabel="BLEU", title="validation BLEU")
    label_epoch_panels(ax_loss, ax_lr, log_lr=any_lr)
    ax_bleu.grid(True, alpha=0.3)
    return finish_figure(fig, ax_bleu if curves else None, title)


def plot_runs(
    curves: Sequence[RunCurves],
    path: str | os.PathLike,
    mark_minutes: float | None = None,
    title: str = "",
) -> Path:
    """Write `draw_runs`'s figure as a PNG (atomically; its folder is created). Returns the path."""
    return save_png(draw_runs(curves, mark_minutes, title), path)
