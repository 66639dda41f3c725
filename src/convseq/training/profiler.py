"""Where the time goes in a training epoch (``python run.py profile=true``).

`EpochProfiler` is a Lightning profiler that receives every hook and step Lightning times and
charges each action's *own* time (its children's subtracted) to data loading, forward,
backward, optimiser, logging, validation, checkpointing, callbacks, or Lightning's loop (the
time between timed actions). `LoggingTimer` times convseq's own logging calls.

Timing reads the clock at every boundary, so a profiled run is a little slower than a plain one;
nothing is timed unless profiling is asked for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.profilers import Profiler
from torch import nn

from convseq.inference.profiler import format_table

EPOCH_PARTS = (
    ("data", "data loading (fetch, collate, to device)"),
    ("forward", "forward (model + loss)"),
    ("backward", "backward"),
    ("optimiser", "optimiser (normalise, clip, step, zero_grad)"),
    ("logging", "logging"),
    ("validation", "validation"),
    ("checkpointing", "checkpointing"),
    ("callbacks", "callbacks and other hooks"),
    ("loop", "Lightning's loop (between timed actions)"),
)
LOG_ACTION = "[convseq]logging"


def epoch_part(action: str) -> str:
    """Which part of `EPOCH_PARTS` a Lightning profiler action belongs to."""
    if action == LOG_ACTION:
        return "logging"
    if action in ("run_training_epoch", "run_training_batch"):
        return "loop"
    if (
        "train_dataloader_next" in action
        or "batch_transfer" in action
        or "batch_to_device" in action
    ):
        return "data"
    if "validation" in action or "val_next" in action or "_EvaluationLoop" in action:
        return "validation"
    if action.endswith(".training_step"):
        return "forward"
    if action.endswith(".backward"):
        return "backward"
    if action.startswith("[LightningModule]") and action.endswith(
        (
            ".optimizer_step",
            ".optimizer_zero_grad",
            ".configure_gradient_clipping",
            ".on_before_optimizer_step",  # convseq normalises the gradients there
        )
    ):
        return "optimiser"
    if "ModelCheckpoint" in action or "checkpoint" in action.lower():
        return "checkpointing"
    return "callbacks"


class EpochProfiler(Profiler):
    """A Lightning profiler that breaks every training epoch down into `EPOCH_PARTS`.

    An epoch runs from its first ``on_train_epoch_start`` hook to the next epoch's (or to
    ``on_train_end``), so it includes validation and the checkpoints saved after it (Lightning
    calls ModelCheckpoint's epoch-end hook after the module's). Each action is charged its own
    time (nested actions are subtracted), so the parts add up to the epoch's wall time exactly;
    ``loop`` is what no action covers. ``action_seconds`` keeps each action's own time, summed
    over the profiled epochs.
    """

    def __init__(self) -> None:
        super().__init__()
        self.epochs: list[dict[str, float]] = []
        self.action_seconds: dict[str, float] = {}
        self._stack: list[list[Any]] = []  # [action, start, children seconds]
        self._current: dict[str, float] | None = None
        self._ending = False  # the module's on_train_epoch_end has run: the epoch's tail
        self._t_epoch = 0.0
        self._covered = 0.0  # top-level action time in the current epoch

    def _close(self, now: float) -> None:
        assert self._current is not None
        wall = now - self._t_epoch
        self._current["loop"] += wall - self._covered
        self._current["wall"] = wall
        self.epochs.append(self._current)
        self._current = None
        self._ending = False

    def start(self, action_name: str) -> None:
        now = time.perf_counter()
        boundary = action_name.endswith((".on_train_epoch_start", ".on_train_end"))
        if self._current is not None and self._ending and boundary and not self._stack:
            self._close(now)
        if self._current is None and action_name.endswith(".on_train_epoch_start"):
            self._current = {key: 0.0 for key, _ in EPOCH_PARTS}
            self._t_epoch = now
            self._covered = 0.0
        self._stack.append([action_name, now, 0.0])

    def stop(self, action_name: str) -> None:
        now = time.perf_counter()
        if not self._stack or self._stack[-1][0] != action_name:
            # Lightning nests its actions; a mismatch would only misattribute: drop the frame
            frames = [i for i, f in enumerate(self._stack) if f[0] == action_name]
            if not frames:
                return
            del self._stack[frames[-1] + 1 :]
        name, start, children = self._stack.pop()
        elapsed = now - start
        if self._stack:
            self._stack[-1][2] += elapsed
        elif self._current is not None:
            self._covered += elapsed
        if self._current is not None:
            own = elapsed - children
            self._current[epoch_part(name)] += own
            self.action_seconds[name] = self.action_seconds.get(name, 0.0) + own
            if name.startswith("[LightningModule]") and name.endswith(".on_train_epoch_end"):
                self._ending = True

    def summary(self) -> str:
        # Lightning prints a profiler's summary after every stage (fit, test); train() prints
        # the table once, at the end of the run, instead.
        return ""

    def top_actions(self, n: int = 12) -> list[tuple[str, float]]:
        """The ``n`` Lightning actions with the most own time over the profiled epochs."""
        return sorted(self.action_seconds.items(), key=lambda kv: -kv[1])[:n]

    def mean(self) -> dict[str, float]:
        """Mean seconds per part over the epochs (the first left out when there are several)."""
        epochs = self.epochs[1:] if len(self.epochs) > 1 else self.epochs
        if not epochs:
            return {}
        keys = [k for k, _ in EPOCH_PARTS] + ["wall"]
        return {k: sum(e[k] for e in epochs) / len(epochs) for k in keys}

    def table(self) -> str:
        mean = self.mean()
        if not mean:
            return "no complete training epoch was profiled"
        n = len(self.epochs) - 1 if len(self.epochs) > 1 else len(self.epochs)
        title = f"Where the time goes (training epoch, mean of {n} epoch{'s' if n > 1 else ''})"
        rows = [(label, mean[key]) for key, label in EPOCH_PARTS]
        return format_table(title, rows, mean["wall"])


def time_logging(module: nn.Module, loggers: Sequence[Any], profiler: Profiler) -> None:
    """Charge the module's ``log``/``log_dict`` calls and the loggers' writes to logging."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with profiler.profile(LOG_ACTION):
                return fn(*args, **kwargs)

        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        return timed

    for name in ("log", "log_dict"):
        object.__setattr__(module, name, wrap(getattr(module, name)))
    for logger in loggers:
        for name in ("log_metrics", "save"):
            if hasattr(logger, name):
                setattr(logger, name, wrap(getattr(logger, name)))


class LoggingTimer(pl.Callback):
    """Puts `time_logging` in place when training starts (with ``profiler=EpochProfiler()``)."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and isinstance(trainer.profiler, EpochProfiler):
            time_logging(pl_module, trainer.loggers, trainer.profiler)
