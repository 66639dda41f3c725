"""Writing figures: every convseq figure is a matplotlib `Figure` on the Agg canvas.

matplotlib is driven through its object API: no pyplot, no global backend switch, no window, so
figures are safe inside a notebook, a SLURM job or a headless CI machine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


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
