"""Fewer threads while other work uses this process's CPUs, all of them again once it stops.

A process alone on its CPUs runs fastest with a thread on each (`convseq.common.threads`). But
a second busy process on the same cores (another run, a test suite, a compile job) meets
torch's idle OpenMP threads, which spin between two operations (libgomp spins ~300,000 turns
before it sleeps) and take the cores the other process needs: two toy runs started together on
2 cores each took 3.5-5x the time of one alone. Passive waiting (OMP_WAIT_POLICY=PASSIVE, or a
short GOMP_SPINCOUNT) cures that but slows the run alone by 30% and more, as its threads are
woken for every small operator (docs/benchmarks.md, `bench/bench_shared_machine.py`).

So the number follows the load instead: a watcher thread reads the kernel's CPU counters
(/proc/stat) for this process's CPUs every `EVERY_SECONDS`, subtracts this process's own CPU
time, and asks for the cores the others leave free (at least 1, at most the rule's number).
The main thread applies the number between two steps (`CpuShare.step`): torch's thread count
is the calling thread's setting, so another thread cannot change it.

Only where the thread rule chose the number from the CPUs (its rule 4): a number set by the
user (trainer.threads, OMP_NUM_THREADS, torch.set_num_threads) stays as it is. Linux only
(elsewhere the number stays the rule's).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable

import torch

__all__ = ["EVERY_SECONDS", "CpuShare", "busy_ticks", "follows", "free_threads", "threads_line"]

EVERY_SECONDS = (
    0.5  # how often the watcher looks (a window of that length: ~100 clock ticks on 2 CPUs)
)
STAT = "/proc/stat"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/stat's per second
# /proc/stat's per-CPU fields: user nice system idle iowait irq softirq steal guest guest_nice;
# busy = user + nice + system + irq + softirq (guest time is inside user; steal, the
# hypervisor's, is no process's here)
_BUSY_FIELDS = (0, 1, 2, 5, 6)


def busy_ticks(stat: str, cpus: Iterable[int]) -> int | None:
    """The busy clock ticks of `cpus` in /proc/stat's text (None when none of them is listed)."""
    wanted, total, seen = set(cpus), 0, 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in wanted:
            continue
        fields = [int(x) for x in rest.split()]
        total += sum(fields[i] for i in _BUSY_FIELDS)
        seen += 1
    return total if seen else None


def free_threads(others: float, cpus: int, most: int) -> int:
    """Threads for the cores that other work (`others`, in cores) leaves of `cpus`: 1 to
    `most`, rounded to the nearest (a process using 0.4 of a core leaves this one all)."""
    return max(1, min(most, int(cpus - others + 0.5)))


def follows(source: str, threads: int) -> bool:
    """Whether a thread choice (`ThreadChoice.source`, `.threads`) follows the load: one the
    rule made from the CPUs (not a number of the user's), of more than one thread."""
    return source.startswith("affinity") and threads > 1


def threads_line(threads: int, source: str) -> str:
    """The line a run starts with: its threads, why, and whether they follow other work."""
    line = f"threads per process: {threads} ({source})"
    if follows(source, threads):
        line += f"; fewer while other work uses these CPUs (a look every {EVERY_SECONDS:g} s)"
    return line


def _read_stat() -> str | None:
    try:
        with open(STAT) as f:
            return f.read()
    except OSError:  # not Linux, or /proc not mounted
        return None


class CpuShare:
    """The watcher and the number it asks for (see the module docstring).

    Args:
        most: the thread rule's number (the most this process takes).
        cpus: this process's CPUs (its affinity).
        every: seconds between two looks.
        read: /proc/stat's text (tests pass their own); clock, own_cpu: wall and this
            process's CPU seconds.
    """

    def __init__(
        self,
        most: int,
        cpus: Iterable[int],
        every: float = EVERY_SECONDS,
        read: Callable[[], str | None] = _read_stat,
        clock: Callable[[], float] = time.monotonic,
        own_cpu: Callable[[], float] = time.process_time,
    ) -> None:
        self.most, self.cpus, self.every = most, frozenset(cpus), every
        self._read, self._clock, self._own = read, clock, own_cpu
        self.wanted = most  # the number asked for
        self._free = most  # what the last look found free
        self.others = 0.0  # the other work's cores at the last look
        self.applied = most
        self._last = self._sample()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> tuple[float, int, float] | None:
        text = self._read()
        ticks = None if text is None else busy_ticks(text, self.cpus)
        return None if ticks is None else (self._clock(), ticks, self._own())

    def look(self) -> int:
        """One look: the other work's cores since the last look, and the threads it leaves."""
        now = self._sample()
        if now is None or self._last is None:
            return self.wanted
        (t0, b0, o0), (t1, b1, o1) = self._last, now
        self._last = now
        if t1 - t0 <= 0:
            return self.wanted
        self.others = max(0.0, ((b1 - b0) / CLOCK_TICKS - (o1 - o0)) / (t1 - t0))
        free = free_threads(self.others, len(self.cpus), self.most)
        # fewer at once; more only when two looks in a row agree (a pause of the other work
        # between two of its steps is not its end)
        if free < self.wanted or free == self._free:
            self.wanted = free
        self._free = free
        return self.wanted

    def start(self) -> CpuShare:
        """Look every `every` seconds in a daemon thread, until `stop`."""
        if self._last is not None and self.most > 1 and self._thread is None:
            self._thread = threading.Thread(
                target=self._watch, name="convseq-cpu-share", daemon=True
            )
            self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.every):
            self.look()

    def stop(self) -> None:
        """Stop looking; in the thread that runs torch's work, also give back the rule's number
        (so that a caller's next run does not take the last number for one of its own)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.every + 1)
            self._thread = None
        if self.applied != self.most:
            torch.set_num_threads(self.most)
            self.applied = self.most

    def step(self) -> str | None:
        """In the thread that runs torch's work, between two steps: apply the number asked for;
        a line saying so when it changed."""
        wanted = self.wanted
        if wanted == self.applied:
            return None
        torch.set_num_threads(wanted)
        self.applied = wanted
        n = len(self.cpus)
        if wanted < self.most:
            return (
                f"threads per process: {wanted} (other work uses {self.others:.1f} of the {n} "
                f"CPUs of this process)"
            )
        return f"threads per process: {wanted} again (the other work on these {n} CPUs stopped)"
