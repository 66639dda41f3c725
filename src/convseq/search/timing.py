"""The phases a search reports, the timer it reports them to, and a timer that sums wall time.

A search calls ``phase(name)`` around each phase of a step (`phase_of` gives a free no-op when no
timer is passed); `PhaseTimer` sums the seconds per phase (`convseq.inference.profiler` builds
the generation profile on it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

# the phases a search reports to its timer, in the order a step runs them:
# encoder; decoder (the step's decoder call, log-softmax included); candidates (masking,
# penalties, cumulative scores, the topk over beam x vocab: the same tensor work in every
# search); selection (which candidates finish, which continue); finalisation (building the
# finished hypotheses); reorder (state and history reordering, batch shrinking)
PHASES = ("encoder", "decoder", "candidates", "selection", "finalisation", "reorder")


class SearchTimer(Protocol):
    """A hook a search calls around each phase; ``phase(name)`` returns a context manager."""

    def phase(self, name: str) -> AbstractContextManager: ...


_NO_PHASE = contextlib.nullcontext()  # reusable: entering it twice is allowed


def phase_of(timer: SearchTimer | None) -> Callable[[str], AbstractContextManager]:
    """The ``phase`` function to call: the timer's, or a free no-op (no host sync, no clock)."""
    if timer is None:
        return lambda name: _NO_PHASE
    return timer.phase


class PhaseTimer:
    """Wall time per phase, summed over calls.

    Args:
        synchronize: called before each clock reading; pass ``torch.cuda.synchronize`` on a
            GPU so queued kernels are charged to the phase that launched them (this costs a
            host sync per phase, which is why timing is off unless a timer is given).
        clock: the clock read (``time.process_time`` gives CPU time, steadier than wall time
            on a machine shared with other work).
    """

    def __init__(
        self,
        synchronize: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.synchronize = synchronize
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.synchronize is not None:
            self.synchronize()
        start = self.clock()
        try:
            yield
        finally:
            if self.synchronize is not None:
                self.synchronize()
            self.seconds[name] = self.seconds.get(name, 0.0) + self.clock() - start
            self.calls[name] = self.calls.get(name, 0) + 1

    def total(self, *names: str) -> float:
        """Seconds spent in the named phases (all phases if none is named)."""
        return sum(s for n, s in self.seconds.items() if not names or n in names)
