"""How long this command has run: the clock of a run's time-to-quality figures.

A user's "minutes to BLEU 40" starts when the command starts, not when training does: start-up,
the data-bin, validation and checkpoint writing all count. On Linux the process's start time is
read from /proc (what `ps` shows); elsewhere the clock starts when convseq is first imported. A
second run in the same process (a notebook, a test) starts its clock when it starts.
"""

from __future__ import annotations

import os
import time

__all__ = ["command_start", "process_seconds"]

_IMPORTED = time.monotonic()
_started = False


def _from_proc() -> float | None:
    """Seconds since this process started, from /proc/self/stat and /proc/uptime; None if
    either is missing or unreadable."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        # the command name (field 2) may hold spaces: the fields after its ')' are counted
        fields = stat.rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of the whole line: starttime, in clock ticks
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def process_seconds() -> float:
    """Wall seconds since this process started (since convseq's import where /proc is absent)."""
    seconds = _from_proc()
    return seconds if seconds is not None else time.monotonic() - _IMPORTED


def command_start() -> float:
    """`time.monotonic()` at the start of the current command: the process's start for its first
    run, now for every later run in the same process."""
    global _started
    now = time.monotonic()
    if _started:
        return now
    _started = True
    return now - process_seconds()
