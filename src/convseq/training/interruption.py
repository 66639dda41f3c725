"""Where a run stopped, what its summary line says, and the exit status of `python run.py`.

A run cut short by SIGTERM or SIGINT is not finished: a job script or a requeue loop must be able
to tell it from one that ended by its own rule or limits. `python run.py` exits with
`EX_TEMPFAIL` (75, sysexits.h's "temporary failure, retry") after such a run and 0 after a
finished one; the summary line and summary.json say where it stopped (epoch, update within the
epoch and overall, the last validation figures) and that `resume=auto` continues it.

A run that a limit or a rule stops inside an epoch (`max_update`, `trainer.max_time`, a stop at a
validation inside the epoch) has trained part of its last epoch: `EpochsDone` counts it as such
("1 epoch and 37 of 250 updates of epoch 2", 1.148 epochs), never as a whole epoch.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from convseq.training.log_interval import updates_per_epoch

__all__ = [
    "CONTINUE_WITH",
    "EX_TEMPFAIL",
    "EpochsDone",
    "epochs_done",
    "exit_status",
    "last_epoch_complete",
    "last_validation",
    "signal_name",
    "stop_point",
    "summary_line",
]

EX_TEMPFAIL = 75  # sysexits.h: temporary failure, the user is invited to retry
CONTINUE_WITH = "resume=auto (or resume=true) with the same command and hydra.run.dir"
# the figures of a validation that the summary line shows, in this order
_SHOWN = ("valid/loss", "valid/bleu")


def signal_name(signum: int | None) -> str | None:
    """`SIGTERM` for 15; None for None."""
    if signum is None:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def stop_point(
    trainer: pl.Trainer, history: list[Mapping[str, Any]], updates: int, mid_epoch: bool
) -> dict[str, Any]:
    """Where training stopped: the epoch it was in (1-based), its updates done and in all, and
    the run's updates (`updates`, as summary.json counts them), taken right after `fit`.

    Args:
        trainer: the Trainer after `fit`.
        history: the per-epoch records of the epochs completed (`ConvSeqModule.history`).
        updates: updates made over the whole run.
        mid_epoch: whether the run stopped inside an epoch (a signal's mid-epoch checkpoint);
            otherwise it stopped at the end of its last completed epoch.
    """
    batches = trainer.num_training_batches
    in_epoch = (
        updates_per_epoch(int(batches), trainer.accumulate_grad_batches)
        if isinstance(batches, int) or (isinstance(batches, float) and math.isfinite(batches))
        else None
    )
    before = int(history[-1]["updates"]) if history else 0
    if mid_epoch:
        return {
            "epoch": len(history) + 1,
            "epoch_updates_done": updates - before,
            "epoch_updates": in_epoch,
            "updates": updates,
            "mid_epoch": True,
        }
    after = int(history[-2]["updates"]) if len(history) > 1 else 0
    return {
        "epoch": len(history),
        "epoch_updates_done": before - after if history else 0,
        "epoch_updates": in_epoch,
        "updates": updates,
        "mid_epoch": False,
    }


def last_epoch_complete(trainer: pl.Trainer) -> bool:
    """Whether the last epoch the Trainer ran went through all its batches (Lightning's own test
    at an epoch's end), taken right after `fit`; False after a stop inside the epoch."""
    return bool(trainer.fit_loop.epoch_loop._num_ready_batches_reached())


def _counted(n: int, noun: str) -> str:
    """`1 epoch`, `0 epochs`, `2 updates`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@dataclass(frozen=True)
class EpochsDone:
    """The epochs a run trained: those it ran to their end, then the updates it made in the
    epoch it stopped in (0: it stopped at an epoch's end)."""

    completed: int
    partial_updates: int = 0
    epoch_updates: int | None = None  # the stopped epoch's updates in all (None: unknown)

    @property
    def trained(self) -> float | None:
        """The epochs as a number, a partial one as its fraction of updates (1 epoch and 37 of
        250 updates: 1.148); None when the partial epoch's length is unknown."""
        if not self.partial_updates:
            return float(self.completed)
        if not self.epoch_updates:
            return None
        return self.completed + self.partial_updates / self.epoch_updates

    def text(self) -> str:
        """`1 epoch`, `2 epochs`, `1 epoch and 37 of 250 updates of epoch 2`."""
        whole = _counted(self.completed, "epoch")
        if not self.partial_updates:
            return whole
        if self.epoch_updates:
            part = f"{self.partial_updates} of {self.epoch_updates} updates"
        else:
            part = _counted(self.partial_updates, "update")
        return f"{whole} and {part} of epoch {self.completed + 1}"


def epochs_done(at: Mapping[str, Any], complete: bool) -> EpochsDone:
    """The epochs trained, from `stop_point`'s record of where training stopped.

    Args:
        at: `stop_point`'s record.
        complete: whether the last epoch ran to its end (`last_epoch_complete`); only read
            when the run did not stop inside an epoch by a signal (`at["mid_epoch"]`).
    """
    epoch, done, total = int(at["epoch"]), int(at["epoch_updates_done"]), at["epoch_updates"]
    if not at["mid_epoch"] and (complete or not done or (total and done >= total)):
        return EpochsDone(epoch, 0, total)
    # inside `epoch` (a signal's stop: none of it may have trained yet)
    return EpochsDone(epoch - 1, done, total)


def last_validation(validations: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The run's last validation record (epoch, updates, lr, valid/* figures), or None."""
    return dict(validations[-1]) if validations else None


def exit_status(summary: Mapping[str, Any]) -> int:
    """`EX_TEMPFAIL` for a run a signal cut short (summary.json's `signal`), else 0."""
    return EX_TEMPFAIL if summary.get("signal") else 0


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.4f}"


def _validation_text(valid: Mapping[str, Any] | None) -> str:
    """`last valid/loss 5.1234, valid/bleu 12.34 (epoch 2)`, or that there was none."""
    if not valid:
        return "no validation yet"
    figures = [
        f"{k} {valid[k]:.2f}" if k == "valid/bleu" else f"{k} {_fmt(valid[k])}"
        for k in _SHOWN
        if isinstance(valid.get(k), (int, float))
    ]
    return f"last {', '.join(figures)} (epoch {valid.get('epoch')}, update {valid.get('updates')})"


def _where(at: Mapping[str, Any]) -> str:
    """`in epoch 2 at update 8 of 18 (26 overall)` or `at the end of epoch 2 (36 updates)`."""
    of = f" of {at['epoch_updates']}" if at.get("epoch_updates") else ""
    if at["mid_epoch"]:
        return (
            f"in epoch {at['epoch']} at update {at['epoch_updates_done']}{of} "
            f"({at['updates']} overall)"
        )
    return f"at the end of epoch {at['epoch']} ({at['updates']} updates)"


def _test_text(test: Mapping[str, Any]) -> str:
    bleu = f" BLEU {test['test/bleu']:.2f}" if "test/bleu" in test else ""
    return f"test loss {_fmt(test.get('test/loss'))} ppl {_fmt(test.get('test/ppl'))}{bleu}"


def _epochs_text(summary: Mapping[str, Any]) -> str:
    """summary.json's epochs in words: a partial last epoch as its updates (`EpochsDone`)."""
    at = summary["stopped_at"]
    completed = int(summary["epochs_completed"])
    partial = int(at["epoch_updates_done"]) if int(at["epoch"]) > completed else 0
    return EpochsDone(completed, partial, at["epoch_updates"]).text()


def summary_line(summary: Mapping[str, Any], output_dir: Path) -> str:
    """The one line a run prints at its end (see the module docstring for a signal's)."""
    if summary.get("signal"):
        return (
            f"convseq: interrupted by {summary['signal']} "
            f"{_where(summary['stopped_at'])} after {summary['train_seconds']:.1f}s; "
            f"{_validation_text(summary.get('last_validation'))}; not finished: continue it "
            f"with {CONTINUE_WITH}; {output_dir}"
        )
    return (
        f"convseq: {_epochs_text(summary)}, {_counted(summary['updates'], 'update')} in "
        f"{summary['train_seconds']:.1f}s; stopped: {summary['stop_reason']}; best "
        f"{summary['optimized_metric']} {_fmt(summary['best_value'])} (epoch "
        f"{summary['best_epoch']}); {_test_text(summary.get('test') or {})}; {output_dir}"
    )
