"""How the idle threads of torch's OpenMP runtime wait: chosen before torch loads it.

torch's CPU build runs its parallel work on libgomp's threads. Between two parallel regions an
idle thread spins (libgomp's default: 300,000 turns of a pause loop, milliseconds on a CPU
whose pause is slow) before it sleeps. Alone on a machine that costs nothing; beside another
busy process (a second run, a sweep job, a test suite) the spinning threads take the cores the
other process needs, and both crawl: two toy runs started together on 2 cores each took 5x
the time of one alone. Sleeping at once (OMP_WAIT_POLICY=PASSIVE) cures that but slows the run
alone by waking its threads for every small operator. A short spin keeps both:
docs/benchmarks.md has the figures (`bench/bench_shared_machine.py`).

The rule, applied as `convseq` is imported (libgomp reads its environment once, when torch
loads it, so later is too late):

1. a wait setting of the user's (OMP_WAIT_POLICY or GOMP_SPINCOUNT in the environment) stays;
2. if torch was imported before convseq, its runtime has started with its own setting;
3. else GOMP_SPINCOUNT=`SPIN_COUNT`, for this process and the processes it starts (DDP ranks,
   sweep jobs). GOMP_SPINCOUNT=300000 gives libgomp's own default back (a machine of your own).

`WaitChoice.text()` is the line a run's header prints.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass

__all__ = ["MARK", "SPIN_COUNT", "USER_WAIT_VARIABLES", "WaitChoice", "choose_wait", "wait_choice"]

# turns an idle libgomp thread spins before it sleeps; libgomp's own default is 300,000
SPIN_COUNT = 10_000
USER_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# set beside GOMP_SPINCOUNT when convseq chose it: a process it starts (a DDP rank, a sweep
# job) then says it runs with convseq's default, not with a setting of the user's
MARK = "CONVSEQ_OMP_WAIT"
DEFAULT_SOURCE = (
    "convseq's default: a short spin, then sleep, so that processes sharing the cores do not "
    "take them from each other; GOMP_SPINCOUNT=300000 is libgomp's own"
)


@dataclass(frozen=True)
class WaitChoice:
    """The wait setting in force and where it came from."""

    setting: str  # e.g. "GOMP_SPINCOUNT=10000", or "libgomp's default"
    source: str  # "convseq's default for a shared machine", "yours", ...

    def text(self) -> str:
        return f"idle threads wait: {self.setting} ({self.source})"


def choose_wait(env: MutableMapping[str, str], torch_loaded: bool) -> WaitChoice:
    """Apply the rule of the module docstring to `env` (os.environ in a run) and say what it
    chose; sets GOMP_SPINCOUNT in `env` only in case 3."""
    mine = [f"{k}={env[k]}" for k in USER_WAIT_VARIABLES if env.get(k)]
    if mine and env.get(MARK) == " ".join(mine):  # set by the convseq process that started this
        return WaitChoice(env[MARK], DEFAULT_SOURCE)
    if mine:
        return WaitChoice(" ".join(mine), "yours, from the environment")
    if torch_loaded:
        return WaitChoice(
            "libgomp's default (spin 300,000)",
            "torch was imported before convseq: import convseq first to share the cores better",
        )
    env["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    env[MARK] = f"GOMP_SPINCOUNT={SPIN_COUNT}"
    return WaitChoice(env[MARK], DEFAULT_SOURCE)


_CHOICE: WaitChoice | None = None


def wait_choice() -> WaitChoice:
    """This process's choice (made once, on the first call: `import convseq` makes it)."""
    global _CHOICE
    if _CHOICE is None:
        _CHOICE = choose_wait(os.environ, torch_loaded="torch" in sys.modules)
    return _CHOICE
