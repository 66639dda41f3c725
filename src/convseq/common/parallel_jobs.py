"""A sweep job's share of this machine's CPUs, when Hydra runs several jobs on it at once.

`hydra/launcher=submitit_local` starts every job of a sweep at once (up to its
`array_parallelism`) without restricting their CPUs, and Hydra's joblib launcher runs `n_jobs`
of them side by side: each job's torch would take every core. A job finds out here how many
jobs share the machine, from the launcher's settings and the sweep's size (the sweep folder's
multirun.yaml, which Hydra writes before it launches the first job), so that
`convseq.common.threads.choose_threads` gives it its share:

- submitit_local with `hydra.launcher.cpus_per_task=N`: N CPUs (submitit itself does not
  restrict them);
- submitit_local without it: the CPUs / the jobs running at once;
- joblib: the CPUs / min(n_jobs, the sweep's jobs);
- the Optuna sweeper: its `n_jobs` trials at a time, with either launcher.

Other launchers (the basic one runs jobs one after the other; SLURM's jobs get their own CPUs)
give None: the job is alone on its CPUs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convseq.common.config import DeviceConfig
from convseq.common.threads import (
    USER_OMP,
    ThreadChoice,
    affinity,
    apply_threads,
    caller_threads,
    choose_threads,
)

__all__ = ["SweepLaunch", "job_cpus", "sweep_job_cpus", "sweep_size", "task_threads"]


def sweep_size(task_overrides: list[str]) -> int:
    """The jobs of a basic sweep over `task_overrides` (`optim=nag,sgd seed=1,2` -> 4)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(task_overrides))
    sizes = [
        len(list(o.sweep_string_iterator()))
        for o in parsed
        if o.is_sweep_override() and o.is_discrete_sweep()
    ]
    return math.prod(sizes) if sizes else 1


@dataclass(frozen=True)
class SweepLaunch:
    """The settings of a sweep's launcher and sweeper that decide how many of its jobs run at
    once on this machine. Hydra's plugins own those nodes (each has keys of its own); these are
    the ones read, with what an absent key means."""

    launcher: str = ""  # hydra.launcher._target_: which launcher plugin
    cpus_per_task: int | None = None  # submitit_local: the CPUs of a job, if given
    array_parallelism: int | None = None  # submitit_local: jobs at once (None: all)
    n_jobs: int = 1  # joblib: jobs at once (-1: as many as CPUs)
    sweeper: str = ""  # hydra.sweeper._target_: which sweeper plugin
    trials_at_once: int | None = None  # the Optuna sweeper's n_jobs

    @classmethod
    def of(cls, launcher: Mapping[str, Any], sweeper: Mapping[str, Any]) -> SweepLaunch:
        """The fields from `hydra.launcher` and `hydra.sweeper`; an absent or null key keeps
        the field's default."""
        wanted = {
            "launcher": (launcher, "_target_"),
            "cpus_per_task": (launcher, "cpus_per_task"),
            "array_parallelism": (launcher, "array_parallelism"),
            "n_jobs": (launcher, "n_jobs"),
            "sweeper": (sweeper, "_target_"),
            "trials_at_once": (sweeper, "n_jobs"),
        }
        given = {
            name: node[key]
            for name, (node, key) in wanted.items()
            if key in node and node[key] is not None
        }
        return cls(**given)


def job_cpus(
    launcher: Mapping[str, Any],
    sweeper: Mapping[str, Any],
    jobs_in_sweep: int,
    cpus: int,
) -> tuple[int, str] | None:
    """(this job's CPUs, how they were found) for a job of a parallel sweep, else None.

    Args:
        launcher: `hydra.launcher` (its `_target_` names the plugin).
        sweeper: `hydra.sweeper`.
        jobs_in_sweep: the jobs of the sweep (of one batch of the Optuna sweeper).
        cpus: the CPUs this process may use.
    """
    launch = SweepLaunch.of(launcher, sweeper)
    at_once = jobs_in_sweep
    if "optuna" in str(launch.sweeper).lower():
        at_once = max(1, int(launch.trials_at_once or 1))
    if str(launch.launcher).endswith("submitit_launcher.LocalLauncher"):
        per_task = launch.cpus_per_task
        if per_task:
            n = min(int(per_task), cpus)
            return n, f"{n} CPUs of hydra.launcher.cpus_per_task={per_task}"
        parallel = launch.array_parallelism or at_once
        jobs = max(1, min(at_once, int(parallel)))
        name = "submitit_local"
    elif "joblib" in str(launch.launcher).lower():
        n_jobs = int(launch.n_jobs)
        n_jobs = cpus if n_jobs < 0 else n_jobs  # joblib: -1 = as many jobs as CPUs
        jobs = max(1, min(at_once, n_jobs))
        name = "joblib"
    else:
        return None
    return (
        max(1, cpus // jobs),
        f"affinity {cpus} / {jobs} parallel jobs of hydra/launcher={name}",
    )


def sweep_job_cpus() -> tuple[int, str] | None:
    """`job_cpus` of this process when it is a job of a Hydra multirun, else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    launcher = OmegaConf.to_container(hydra_cfg.launcher, resolve=False)
    sweeper = OmegaConf.to_container(hydra_cfg.sweeper, resolve=False)
    jobs = 1
    saved = Path(str(hydra_cfg.sweep.dir)) / "multirun.yaml"
    if saved.is_file():
        parent = OmegaConf.load(saved)
        overrides = OmegaConf.select(parent, "hydra.overrides.task", default=[]) or []
        try:
            jobs = sweep_size(list(overrides))
        except Exception:  # a sweep syntax the basic sweeper's parser does not know
            jobs = 1
    return job_cpus(launcher, sweeper, jobs, len(affinity()))  # type: ignore[arg-type]


def task_threads(trainer_cfg: DeviceConfig) -> ThreadChoice:
    """Choose and set this process's torch threads (`convseq.common.threads`) for a task whose
    `trainer` config this is; a job of a sweep run in parallel on this machine takes its share.
    """
    job = sweep_job_cpus()
    choice = choose_threads(trainer_cfg, job_cpus=job, user_omp=USER_OMP, caller=caller_threads())
    if choice.source == "OMP_NUM_THREADS" and job is not None and "joblib" in job[1]:
        # joblib's workers get OMP_NUM_THREADS = CPUs / n_jobs unless the user set it first
        choice = ThreadChoice(
            choice.threads, "OMP_NUM_THREADS (yours, or joblib's for its workers)"
        )
    apply_threads(choice)
    return choice
