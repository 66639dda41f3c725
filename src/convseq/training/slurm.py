"""Running under SLURM: the requeue signal goes through convseq's own stop, one checkpoint.

Lightning's SLURM support, left to itself, handles the requeue signal (SIGUSR1) inside the signal
handler: it writes `hpc_ckpt_N.ckpt` in the run folder wherever the batch happens to be, runs
`scontrol requeue <job id>` and trains on until SLURM kills the job; and a run started without a
checkpoint path in a folder holding such a file silently continues from it. convseq instead:

- builds the Trainer with Lightning's `SLURMEnvironment(auto_requeue=False)`, so Lightning
  installs no requeue handler and writes no `hpc_ckpt_*.ckpt`;
- treats the requeue signal as SIGTERM is treated (`SignalCallback`: `checkpoints/last.ckpt` at
  the end of the current update, every rank stopping at the same one), and once the run's summary
  is written rank 0 runs `scontrol requeue <job id>` (`request_requeue`); the status is 75 as after
  any signal. A plain SIGTERM (a cancelled job, or `--signal=TERM@...`) never requeues.
- So the run folder holds one checkpoint to continue from, `last.ckpt`, and `resume=true|auto`
  reads it; an `hpc_ckpt_*.ckpt` found there (left by another program) is never read, and a new
  run under SLURM refuses a folder holding one (`refuse_hpc_checkpoints`), since Lightning would
  load it on its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from lightning_fabric.plugins.environments import SLURMEnvironment

from convseq.errors import CheckpointError

__all__ = [
    "HPC_PATTERN",
    "cluster_plugins",
    "refuse_hpc_checkpoints",
    "request_requeue",
    "requeue_signal",
    "slurm_job_id",
    "under_slurm",
]

HPC_PATTERN = "hpc_ckpt_*.ckpt"  # Lightning's requeue checkpoints, in the Trainer's root dir


def under_slurm() -> bool:
    """Whether Lightning takes this process for a SLURM task (`SLURM_NTASKS` set, and the job
    not named `bash` or `interactive`)."""
    return SLURMEnvironment.detect()


def cluster_plugins() -> list[Any]:
    """The Trainer's cluster environment under SLURM: Lightning's, without its requeue handler."""
    return [SLURMEnvironment(auto_requeue=False)] if under_slurm() else []


def requeue_signal() -> signal.Signals | None:
    """The signal that asks for a save and a requeue (SIGUSR1, SLURM's `--signal=USR1@...`);
    None outside SLURM, where SIGUSR1 keeps its usual meaning."""
    return signal.SIGUSR1 if under_slurm() else None


def slurm_job_id() -> str | None:
    """The job to requeue: `<array job>_<task>` for an array task, else `SLURM_JOB_ID`."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID") or None


def request_requeue() -> str:
    """Run `scontrol requeue <job id>`; return the line that says what happened.

    Called once, by rank 0, after the checkpoint and the summary are written: SLURM ends the job
    as soon as it requeues it.
    """
    job = slurm_job_id()
    if job is None:
        return "convseq: no SLURM_JOB_ID: requeue the job yourself"
    command = ["scontrol", "requeue", job]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"convseq: `{' '.join(command)}` failed ({e}): requeue the job yourself"
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        return (
            f"convseq: `{' '.join(command)}` exited with {done.returncode} ({why[0]}): "
            "requeue the job yourself"
        )
    return f"convseq: asked SLURM to requeue job {job} (`{' '.join(command)}`)"


def refuse_hpc_checkpoints(output_dir: Path, resume: Path | None) -> None:
    """A new run under SLURM in a folder holding `hpc_ckpt_*.ckpt`: refused, naming the file.

    Lightning continues from such a file by itself when `fit` gets no checkpoint; convseq only
    ever continues from the checkpoint `resume` names (last.ckpt), so the file must go.
    """
    if resume is not None or not under_slurm():
        return
    found = sorted(Path(output_dir).glob(HPC_PATTERN))
    if found:
        raise CheckpointError(
            f"{found[-1]}: Lightning's SLURM requeue checkpoint, which convseq never continues "
            "from (it continues from checkpoints/last.ckpt with resume=true or resume=auto); "
            "remove it or choose another hydra.run.dir"
        )
