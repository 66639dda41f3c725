"""Sweep curves as one PNG: validation loss vs epoch and lr vs epoch, one line per job.

matplotlib is driven through its object API with the Agg canvas: no pyplot, no global backend
switch, no window, so it is safe inside a notebook, a SLURM job or a headless CI machine.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from convseq.viz.canvas import label_epoch_panels, save_png

__all__ = ["finite_points", "plot_curves"]


def finite_points(xs: Sequence[Any], ys: Sequence[Any]) -> tuple[list[float], list[float]]:
    """The (x, y) pairs with both present and y finite, as two lists (what a curve can draw)."""
    pairs = [
        (float(x), float(y))
        for x, y in zip(xs, ys)
        if x is not None and y is not None and math.isfinite(float(y))
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def plot_curves(curves: Sequence[dict[str, Any]], path: str | os.PathLike, title: str = "") -> Path:
    """Write a PNG with two panels, validation loss and lr against the (1-based) epoch.

    Args:
        curves: one dict per job: ``label``, ``epoch`` (list of epochs), ``valid_loss`` and ``lr``
            (lists of the same length; None or NaN where an epoch has no value).
        path: the PNG to write (its folder is created).
        title: a line above both panels.

    Returns:
        The path written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax_loss, ax_lr = fig.subplots(1, 2)
    any_lr = False
    for curve in curves:
        label = str(curve.get("label") or "")
        x, y = finite_points(curve["epoch"], curve["valid_loss"])
        ax_loss.plot(x, y, marker="o", markersize=3, label=label)
        x, y = finite_points(curve["epoch"], curve["lr"])
        positive = [(a, b) for a, b in zip(x, y) if b > 0]
        any_lr = any_lr or bool(positive)
        ax_lr.plot([a for a, _ in positive], [b for _, b in positive], marker="o", markersize=3)
    label_epoch_panels(ax_loss, ax_lr, log_lr=any_lr)
    if curves:
        ax_loss.legend(fontsize="small", loc="best")
    if title:
        fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return save_png(fig, path)
