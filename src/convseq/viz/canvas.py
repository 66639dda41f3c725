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
