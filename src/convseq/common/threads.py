"""How many threads each process of a run takes: its share of the CPUs it may use.

torch's default is every core of the machine in every process, so processes that share a
machine (the ranks of a DDP run, the jobs of a sweep run in parallel) oversubscribe the cores
and their threads spin against each other (a 2-job sweep on 2 cores ran ~10x slower per job).
The rule, in order of precedence:

1. `trainer.threads=N` (the config);
2. `OMP_NUM_THREADS`, when the user set it before the process started;
3. in a script or notebook that calls convseq, a number it set with `torch.set_num_threads`;
4. the CPUs this process may use (its affinity, which SLURM, `taskset` and containers restrict)
   divided by the processes that share them: `LOCAL_WORLD_SIZE` under torchrun, Lightning's
   devices per node for its own DDP launch, the jobs of a sweep run in parallel on this machine
   (`parallel_jobs`), and, once the process group is up, the ranks found on this host with
   CPUs in common (`local_share`), which also covers torchrun "nodes" started on one machine.

`ThreadChoice.source` says where the number came from; the run's header prints it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from convseq.common.config import DeviceConfig
from convseq.errors import SettingError

__all__ = [
    "USER_OMP",
    "ThreadChoice",
    "affinity",
    "apply_threads",
    "caller_threads",
    "choose_threads",
    "local_share",
]

# OMP_NUM_THREADS as the user set it before this process started: read at import, before
# Lightning's launcher sets it (in the parent only, after starting its children) for itself.
USER_OMP: str | None = os.environ.get("OMP_NUM_THREADS")
# torch's own default, and the last number the rule (not a user's setting) gave: any other
# number was set by the calling script
_TORCH_DEFAULT = torch.get_num_threads()
_applied: int | None = None


def caller_threads() -> int | None:
    """The threads a calling script set with torch.set_num_threads, if it changed them."""
    n = torch.get_num_threads()
    return n if n not in (_TORCH_DEFAULT, _applied) else None


@dataclass(frozen=True)
class ThreadChoice:
    """Threads per process and where that number came from, e.g. (1, "affinity 2 / 2 local
    processes (LOCAL_WORLD_SIZE)")."""

    threads: int
    source: str


def affinity() -> set[int]:
    """The CPUs this process may run on (all of them where the OS cannot say)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows: no affinity API
        return set(range(os.cpu_count() or 1))


def _positive(value: Any, what: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise SettingError(f"{what}={value!r}: give a whole number of threads >= 1")
    return n


def _devices_per_node(trainer: DeviceConfig) -> int:
    """The processes Lightning starts on each machine for its own DDP launch (1 otherwise)."""
    if not str(trainer.strategy).startswith("ddp"):
        return 1
    devices = trainer.devices
    if isinstance(devices, (list, tuple)):
        return max(len(devices), 1)
    try:
        return max(int(devices), 1)
    except (TypeError, ValueError):  # "auto", -1: as many as there are; the group tells later
        return 1


def choose_threads(
    trainer: DeviceConfig,
    job_cpus: tuple[int, str] | None = None,
    env: Mapping[str, str] | None = None,
    user_omp: str | None = None,
    cpus: int | None = None,
    caller: int | None = None,
) -> ThreadChoice:
    """The threads per process of a run whose `trainer` config this is (see the module docstring).

    Args:
        trainer: the `trainer` config (its `threads`, `strategy`, `devices`).
        job_cpus: for a sweep job run in parallel with others on this machine, its share of the
            CPUs and how it was found, e.g. (1, "2 CPUs / 2 parallel jobs of
            hydra/launcher=joblib"); None for a run alone.
        env: the environment (os.environ); LOCAL_WORLD_SIZE is torchrun's.
        user_omp: OMP_NUM_THREADS as set before start (`USER_OMP`).
        cpus: the CPUs this process may use (default: its affinity).
        caller: threads a calling script set itself (`caller_threads`).
    """
    env = os.environ if env is None else env
    requested = trainer.threads
    if requested is not None:
        return ThreadChoice(_positive(requested, "trainer.threads"), "trainer.threads")
    if user_omp:
        return ThreadChoice(_positive(user_omp, "OMP_NUM_THREADS"), "OMP_NUM_THREADS")
    if caller is not None:
        return ThreadChoice(int(caller), "torch.set_num_threads by the caller")
    n_cpus = len(affinity()) if cpus is None else int(cpus)
    local = env.get("LOCAL_WORLD_SIZE")
    if local:
        procs, why = _positive(local, "LOCAL_WORLD_SIZE"), "LOCAL_WORLD_SIZE"
    else:
        procs, why = _devices_per_node(trainer), "trainer.devices"
    if job_cpus is not None:
        share, how = job_cpus
        per = f" / {procs} local processes ({why})" if procs > 1 else ""
        return ThreadChoice(max(1, min(share, n_cpus) // procs), f"{how}{per}")
    if procs == 1:
        return ThreadChoice(max(1, n_cpus), f"affinity {n_cpus} / 1 process")
    return ThreadChoice(
        max(1, n_cpus // procs), f"affinity {n_cpus} / {procs} local processes ({why})"
    )


def local_share(
    choice: ThreadChoice, peers: Sequence[tuple[str, frozenset[int]]], me: int
) -> ThreadChoice:
    """The choice once every rank's (host, CPUs) is known: my CPUs over the ranks on my host
    whose CPUs overlap mine (torchrun nodes started on one machine each see LOCAL_WORLD_SIZE=1).

    A number set by the user (trainer.threads, OMP_NUM_THREADS) and a sweep job's share stay.
    Ranks bound to CPUs of their own (srun's binding) each keep all of theirs.
    """
    if not choice.source.startswith("affinity"):
        return choice
    host, mine = peers[me]
    sharing = max(1, sum(1 for h, cpus in peers if h == host and cpus & mine))
    n = max(1, len(mine) // sharing)
    return ThreadChoice(n, f"affinity {len(mine)} / {sharing} processes of the run on this host")


def apply_threads(choice: ThreadChoice) -> None:
    """Set torch's intra-op threads (and, before any parallel work started, inter-op ones)."""
    global _applied
    if choice.source.startswith("affinity") or "parallel jobs" in choice.source:
        _applied = choice.threads  # the rule's: not to be taken for the caller's next time
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    try:
        # inter-op threads can only be set before the first inter-op parallel work
        torch.set_num_interop_threads(choice.threads)
    except RuntimeError:
        pass
