"""The study report's figures: valid BLEU by training minutes, lr by epoch, epochs and time per arm.

Three PNGs, one line (or bar) per arm, the same colour for an arm in every figure:

- validation BLEU against cumulative training minutes: the curve a reader uses to pick a rule
  for a fixed time budget;
- the lr of each epoch on a log axis: when each rule started annealing and how fast it went;
- two bar panels: total epochs and total training time per arm.

Plain numbers in (`RunCurves` of `convseq.viz.runs`), files out; matplotlib's object API on the
Agg canvas (see `convseq.viz.canvas`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from convseq.viz.canvas import save_png
from convseq.viz.curves import finite_points
from convseq.viz.runs import RunCurves

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["draw_bleu_minutes", "draw_epoch_time_bars", "draw_lr_epochs", "plot_study"]

Style = Mapping[str, Any]  # extra keyword arguments of Axes.plot for one line (e.g. linestyle)


def _figure(width: float, height: float, panels: int = 1) -> tuple[Figure, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, panels)


def _colour(i: int, n: int) -> Any:
    """Distinct colours for up to 20 arms (tab10 up to 10, tab20 beyond)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return cmap(i % cmap.N)


def _lines(
    ax: Any,
    curves: Sequence[RunCurves],
    styles: Sequence[Style] | None,
    x: str,
    y: str,
    positive: bool = False,
) -> bool:
    """One line per curve on `ax`; returns whether any point was drawn."""
    drawn = False
    for i, c in enumerate(curves):
        xs, ys = finite_points(getattr(c, x), getattr(c, y))
        if positive:  # a log axis cannot show values <= 0
            keep = [(a, b) for a, b in zip(xs, ys) if b > 0]
            xs, ys = [a for a, _ in keep], [b for _, b in keep]
        drawn = drawn or bool(xs)
        style = {"marker": "o", "markersize": 2.5, "linewidth": 1.3}
        style.update(dict(styles[i]) if styles is not None else {})
        ax.plot(xs, ys, color=_colour(i, len(curves)), label=c.label, **style)
    return drawn


ZOOM_BLEU = 6.0  # the right panel of the BLEU figure shows the last this-many BLEU below the best


def _zoom(ax: Any, curves: Sequence[RunCurves], span: float) -> None:
    """Limit `ax` to the top `span` BLEU and the minutes from where any arm first got there.

    Why: the full curves climb from 0 to ~40 BLEU, so the differences that decide between rules
    (a BLEU or two near the end) are a few pixels high on the left panel.
    """
    points = [finite_points(c.minutes, c.valid_bleu) for c in curves]
    ys = [y for _, pys in points for y in pys]
    if not ys:
        return
    top = max(ys)
    floor = top - span
    starts = [x for pxs, pys in points for x, y in zip(pxs, pys) if y >= floor]
    # only curves that reach the band set the right edge: a long run far below it (plain SGD at
    # a small lr) would otherwise stretch the panel over minutes where nothing is drawn
    right = max(x for pxs, pys in points if any(y >= floor for y in pys) for x in pxs)
    left = min(starts)
    pad = 0.02 * max(right - left, 1e-9)
    ax.set_xlim(left - pad, right + pad)
    ax.set_ylim(floor, top + 0.1 * span)


def draw_bleu_minutes(
    curves: Sequence[RunCurves], styles: Sequence[Style] | None = None, title: str = ""
) -> Figure:
    """Validation BLEU against cumulative training minutes, one line per run (``ax.lines[i]``).

    Two panels: every curve whole (``axes[0]``), and the same lines zoomed on the top
    `ZOOM_BLEU` BLEU (``axes[1]``), where the rules differ.
    """
    fig, (ax, zoom) = _figure(14, 6, panels=2)
    for a in (ax, zoom):
        _lines(a, curves, styles, "minutes", "valid_bleu")
        a.set(xlabel="training minutes (cumulative)", ylabel="validation BLEU")
        a.grid(True, alpha=0.3)
    _zoom(zoom, curves, ZOOM_BLEU)
    ax.set_title("whole runs")
    zoom.set_title(f"zoom: the top {ZOOM_BLEU:g} BLEU")
    fig.suptitle(title or "validation BLEU by training time", fontsize="medium")
    if curves:
        # centre right: the lower right is where long, slow runs (plain SGD) end
        ax.legend(fontsize="small", loc="center right", ncol=2)
    fig.tight_layout()
    return fig


def draw_lr_epochs(
    curves: Sequence[RunCurves], styles: Sequence[Style] | None = None, title: str = ""
) -> Figure:
    """The lr of each epoch (at its start) on a log axis, one line per run."""
    fig, ax = _figure(10, 6)
    if _lines(ax, curves, styles, "epoch", "lr", positive=True):
        ax.set_yscale("log")  # annealing multiplies lr: equal steps on a log axis
    ax.set(xlabel="epoch", ylabel="learning rate (log)")
    ax.set_title(title or "learning rate by epoch")
    ax.grid(True, alpha=0.3, which="both")
    ax.xaxis.get_major_locator().set_params(integer=True)
    if curves:
        ax.legend(fontsize="small", loc="lower left", ncol=2)
    fig.tight_layout()
    return fig


def draw_epoch_time_bars(
    labels: Sequence[str],
    epochs: Sequence[float],
    minutes: Sequence[float],
    done: Sequence[bool] | None = None,
    title: str = "",
) -> Figure:
    """Two panels of horizontal bars, one per arm: total epochs, total training minutes.

    Args:
        labels: the arms, top to bottom.
        epochs, minutes: their totals (NaN: no bar).
        done: per arm whether it stopped by its own rule; the others are hatched (a lower
            bound: unfinished, or cut by a limit).
        title: a line above both panels.
    """
    fig, (ax_e, ax_t) = _figure(12, 0.9 + 0.38 * max(len(labels), 1), panels=2)
    ys = list(range(len(labels)))
    colours = [_colour(i, len(labels)) for i in ys]
    hatches = ["" if done is None or done[i] else "//" for i in ys]
    for ax, values, what in ((ax_e, epochs, "total epochs"), (ax_t, minutes, "training minutes")):
        heights = [float(v) if v == v else 0.0 for v in values]  # NaN -> no bar
        bars = ax.barh(ys, heights, color=colours, edgecolor="0.2", linewidth=0.5)
        for bar, hatch, v in zip(bars, hatches, values):
            bar.set_hatch(hatch)
            if v == v:
                ax.text(
                    bar.get_width(),
                    bar.get_y() + bar.get_height() / 2,
                    f" {v:.0f}",
                    va="center",
                    fontsize="small",
                )
        ax.set_yticks(ys, list(labels), fontsize="small")
        ax.invert_yaxis()  # the first arm on top
        ax.set(xlabel=what)
        ax.grid(True, axis="x", alpha=0.3)
        ax.margins(x=0.12)
    ax_e.set_title("epochs to the arm's own stop")
    ax_t.set_title("total training time")
    if done is not None and not all(done):  # in the title line: below the axes it hid a label
        title = f"{title}; " if title else ""
        title += "hatched: unfinished or cut by a limit"
    if title:
        fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return fig


def plot_study(
    curves: Sequence[RunCurves],
    paths: Mapping[str, str | os.PathLike],
    styles: Sequence[Style] | None = None,
    bars: Mapping[str, Sequence[Any]] | None = None,
    title: str = "",
) -> dict[str, Path]:
    """Write the three figures; `paths` maps ``bleu``, ``lr`` and ``bars`` to PNG files.

    `bars` holds ``labels``, ``epochs``, ``minutes`` and ``done`` (see `draw_epoch_time_bars`);
    without it the bar chart is drawn from the curves' last epoch and minute.
    """
    if bars is None:
        bars = {
            "labels": [c.label for c in curves],
            "epochs": [float(c.epoch[-1]) if c.epoch else float("nan") for c in curves],
            "minutes": [
                float(c.minutes[-1]) if c.minutes and c.minutes[-1] is not None else float("nan")
                for c in curves
            ],
            "done": None,
        }
    suffix = f" ({title})" if title else ""
    return {
        "bleu": save_png(
            draw_bleu_minutes(curves, styles, "validation BLEU by training time" + suffix),
            paths["bleu"],
        ),
        "lr": save_png(
            draw_lr_epochs(curves, styles, "learning rate by epoch" + suffix), paths["lr"]
        ),
        "bars": save_png(
            draw_epoch_time_bars(
                bars["labels"], bars["epochs"], bars["minutes"], bars.get("done"), title
            ),
            paths["bars"],
        ),
    }
