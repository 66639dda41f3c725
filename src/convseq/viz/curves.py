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

from convseq.viz.canvas import finish_figure, label_epoch_panels, new_figure, plot_lr, save_png

__all__ = ["X_AXES", "draw_curves", "finite_points", "plot_curves"]


def finite_points(xs: Sequence[Any], ys: Sequence[Any]) -> tuple[list[float], list[float]]:
    """The (x, y) pairs with both present and y finite, as two lists (what a curve can draw)."""
    pairs = [
        (float(x), float(y))
        for x, y in zip(xs, ys)
        if x is not None and y is not None and math.isfinite(float(y))
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


X_AXES = ("epoch", "updates")  # what the sweep curves are drawn against


def draw_curves(curves: Sequence[dict[str, Any]], title: str = "", x: str = "epoch") -> Any:
    """A Figure (Agg canvas) with two panels, validation loss and lr, one line per job.

    Args:
        curves: one dict per job: ``label``, per epoch ``epoch``, ``valid_loss`` and ``lr``
            (None or NaN where an epoch has no value); for ``x="updates"`` also, per validation,
            ``validation_updates``, ``validation_loss`` and ``validation_lr``.
        title: a line above both panels.
        x: ``epoch``, or ``updates`` (for runs that validate every N updates: a point per
            validation, at its update count).
    """
    if x not in X_AXES:
        raise ValueError(f"x={x!r}: choose one of {X_AXES}")
    keys = ("epoch", "valid_loss", "lr")
    if x == "updates":
        keys = ("validation_updates", "validation_loss", "validation_lr")
    fig = new_figure(11, 4.2)
    ax_loss, ax_lr = fig.subplots(1, 2)
    any_lr = False
    for curve in curves:
        label = str(curve.get("label") or "")
        xs = curve.get(keys[0]) or []
        px, py = finite_points(xs, curve.get(keys[1]) or [])
        ax_loss.plot(px, py, marker="o", markersize=3, label=label)
        drawn = plot_lr(ax_lr, *finite_points(xs, curve.get(keys[2]) or []))
        any_lr = any_lr or drawn
    label_epoch_panels(ax_loss, ax_lr, log_lr=any_lr)
    if x == "updates":
        ax_loss.set_xlabel("update")
        ax_lr.set(xlabel="update", title="learning rate (at each validation)")
    return finish_figure(fig, ax_loss if curves else None, title)


def plot_curves(
    curves: Sequence[dict[str, Any]], path: str | os.PathLike, title: str = "", x: str = "epoch"
) -> Path:
    """Write `draw_curves`'s figure as a PNG (its folder is created); returns the path."""
    return save_png(draw_curves(curves, title, x), path)
