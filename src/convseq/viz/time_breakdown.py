"""The generate run's time breakdown as a horizontal bar chart: ``gen.profile=true``.

The bars are the rows of `GenerationProfiler.table` (the same figures, the same order, top to
bottom): seconds per part, each labelled with its share of the wall time. The decoder's sub-rows
(convolutions, attention, ...) are parts *of* the decoder bar, so they are drawn lighter (the
legend says so); the other bars together with "not attributed" add up to the wall time.

matplotlib's object API with the Agg canvas, as every `convseq.viz` figure: no pyplot, no window.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from convseq.viz.canvas import new_figure, save_png

__all__ = ["draw_time_breakdown", "write_time_breakdown"]

TOP_COLOUR = "tab:blue"
SUB_COLOUR = "lightsteelblue"


def draw_time_breakdown(
    rows: Sequence[tuple[str, float, bool]], wall: float, title: str = "Where the time goes"
) -> Any:
    """A matplotlib Figure (Agg canvas): one horizontal bar per row, first row at the top.

    Args:
        rows: (label, seconds, is a sub-row) as `GenerationProfiler.rows` gives them.
        wall: the wall time the percentages are shares of.
        title: the chart's title (the wall time is appended).
    """
    n = len(rows)
    fig = new_figure(10, max(2.5, 0.38 * n + 1.2))
    ax = fig.subplots()
    seconds = [max(float(secs), 0.0) for _, secs, _ in rows]  # a tiny negative remainder: 0
    labels = [label for label, _, _ in rows]
    colours = [SUB_COLOUR if sub else TOP_COLOUR for _, _, sub in rows]
    positions = list(range(n))
    bars = ax.barh(positions, seconds, color=colours)
    ax.set_yticks(positions)
    ax.set_yticklabels(labels, fontsize="small", parse_math=False)
    ax.invert_yaxis()  # the table's first row on top
    pcts = [100.0 * float(secs) / wall if wall > 0 else 0.0 for _, secs, _ in rows]
    ax.bar_label(bars, labels=[f"{p:.1f}%" for p in pcts], padding=3, fontsize="small")
    ax.set_xlim(0.0, max(seconds, default=0.0) * 1.15 or 1.0)  # room for the labels
    ax.set_xlabel("seconds")
    ax.set_title(f"{title} (wall time {wall:.3f} s)", fontsize="medium")
    ax.grid(True, axis="x", alpha=0.3)
    if any(sub for _, _, sub in rows):
        from matplotlib.patches import Patch

        legend = [Patch(color=TOP_COLOUR, label="part of the wall time")]
        legend.append(Patch(color=SUB_COLOUR, label="part of the decoder row"))
        ax.legend(handles=legend, loc="lower right", fontsize="small")
    fig.tight_layout()
    return fig


def write_time_breakdown(
    rows: Sequence[tuple[str, float, bool]],
    wall: float,
    path: str | os.PathLike,
    title: str = "Where the time goes",
) -> Path:
    """Draw `draw_time_breakdown` into the PNG ``path``; returns the path."""
    return save_png(draw_time_breakdown(rows, wall, title), path)
