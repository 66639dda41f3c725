"""`task=average`: average checkpoints' parameters (`convseq.checkpoints.average`).

python run.py task=average ckpts=[a.ckpt,b.ckpt,c.ckpt]
python run.py task=average ckpts=[RUN_DIR] average.last_n=5   # the run's last 5 epochNNN.ckpt

The checkpoints must have been trained on the same data; the averaged one carries those data
settings, so that task=generate finds its data without ``data=``. A ``data`` given on the
command line is checked against every input.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from convseq.checkpoints.average import DEFAULT_NAME, average_checkpoints, last_n_checkpoints
from convseq.errors import CheckpointError
from convseq.inference.data_match import split_given
from convseq.tasks.config import AverageTaskConfig

__all__ = ["run_average"]


def _expand(ckpts: Sequence[str] | str | None) -> list[Path]:
    if ckpts is None:
        return []
    if isinstance(ckpts, (str, os.PathLike)):
        ckpts = [ckpts]
    return [Path(os.path.expanduser(str(c))).absolute() for c in ckpts]


def run_average(cfg: AverageTaskConfig) -> Path:
    """`task=average`: the checkpoints of `ckpts` (or the last `average.last_n` of a run).

    Writes `average.output`, by default `<output_dir>/averaged.ckpt` (the Hydra folder of
    this command), and prints the path. ``cfg.data``: empty when the user gave no data (the
    inputs' own is kept), else a data option every input must have been trained on.
    """
    ckpts = _expand(cfg.ckpts)
    last_n = cfg.average.last_n
    if last_n > 0:
        if len(ckpts) != 1:
            raise CheckpointError(
                f"average.last_n={last_n} reads one run folder; set ckpts=[RUN_DIR] (got "
                f"{len(ckpts)} paths)"
            )
        ckpts = last_n_checkpoints(ckpts[0], last_n)
    else:
        for p in ckpts:
            if p.is_dir():
                raise CheckpointError(
                    f"{p}: a folder; list checkpoint files in ckpts, or average the run's last "
                    "epochs with average.last_n=N"
                )
    output = cfg.average.output or Path(cfg.paths.output_dir) / DEFAULT_NAME
    # compared with what each checkpoint records of its data: plain values
    given, _ = split_given(cfg.data)  # keys alone (no data option) change nothing here
    path = average_checkpoints(ckpts, output, given)
    names = ", ".join(str(p) for p in ckpts)
    print(f"convseq: averaged {len(ckpts)} checkpoints ({names}) into {path}", flush=True)
    return path
