"""Writing figures: every convseq figure is a matplotlib `Figure` on the Agg canvas.

matplotlib is driven through its object API: no pyplot, no global backend switch, no window, so
figures are safe inside a notebook, a SLURM job or a headless CI machine.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def new_figure(width: float, height: float) -> Any:
    """An empty matplotlib Figure on the Agg canvas, `width` x `height` inches at 100 dpi."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def finish_figure(fig: Any, legend_ax: Any | None, title: str) -> Any:
    """The legend of `legend_ax` (None: no legend), the title above every panel, and a tight
    layout; returns the figure."""
    if legend_ax is not None:
        legend_ax.legend(fontsize="small", loc="best")
    if title:
        fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return fig


def plot_lr(ax_lr: Any, xs: Sequence[float], lrs: Sequence[float], **style: Any) -> bool:
    """One lr curve on the (log) lr panel, its positive points only (a log axis cannot show
    lr <= 0); returns whether any point was drawn."""
    positive = [(x, lr) for x, lr in zip(xs, lrs) if lr > 0]
    xs, lrs = [x for x, _ in positive], [lr for _, lr in positive]
    ax_lr.plot(xs, lrs, marker="o", markersize=3, **style)
    return bool(positive)


def save_png(fig: Any, path: str | os.PathLike) -> Path:
    """Write the figure as a PNG (through a temporary file, so a reader never sees half of it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path


def label_epoch_panels(ax_loss: Any, ax_lr: Any, log_lr: bool) -> None:
    """Axes, titles and grid of the validation-loss and lr panels (both against the epoch)."""
    ax_loss.set(xlabel="epoch", ylabel="validation loss (bits/token)", title="validation loss")
    ax_lr.set(xlabel="epoch", ylabel="learning rate", title="learning rate (start of epoch)")
    if log_lr:
        ax_lr.set_yscale("log")  # annealing multiplies lr: equal steps on a log axis
    for ax in (ax_loss, ax_lr):
        ax.grid(True, alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
