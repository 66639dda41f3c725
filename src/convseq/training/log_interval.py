"""The logging interval clamped to an epoch: per-update figures reach the logs every epoch.

Lightning writes the per-update figures (`train/loss`, ...) every `trainer.log_every_n_steps`
updates, and warns when an epoch has fewer batches than that ("The number of training batches
(N) is smaller than the logging interval"): on a small corpus the default 50 would log nothing
for several epochs. `LogIntervalClamp` lowers the interval to the epoch's number of updates
before the fit loop looks at it (a callback's `setup` runs after the data module's and before
the loop's check), so the warning never comes and each epoch logs at least once; convseq says so
in one line when it changes the interval.
"""

from __future__ import annotations

import math

import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_info

__all__ = ["LogIntervalClamp", "updates_per_epoch"]


def updates_per_epoch(batches: int, accumulate: int) -> int:
    """Optimizer updates in an epoch of `batches` batches (the last update may be partial)."""
    return math.ceil(batches / max(int(accumulate), 1))


def _train_batches(trainer: pl.Trainer) -> int | None:
    """This rank's training batches in an epoch (after `trainer.limit_train_batches`), or None
    when the data module cannot say before its loader is made."""
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is None or not hasattr(datamodule, "batch_sampler"):
        return None
    batches = len(datamodule.batch_sampler("train"))
    limit = trainer.limit_train_batches
    if isinstance(limit, int):
        return min(batches, limit)
    if limit is not None and float(limit) < 1.0:
        return int(batches * float(limit))  # Lightning's own rounding of a fraction
    return batches


class LogIntervalClamp(pl.Callback):
    """Sets `trainer.log_every_n_steps` to at most the updates of one epoch (never below 1)."""

    def __init__(self) -> None:
        self.configured: int | None = None  # the interval asked for (trainer.log_every_n_steps)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or trainer.fast_dev_run:
            return
        asked = int(trainer.log_every_n_steps)
        if self.configured is None:
            self.configured = asked
        if asked <= 0:  # logging per update is off
            return
        batches = _train_batches(trainer)
        if not batches:
            return
        updates = updates_per_epoch(batches, trainer.accumulate_grad_batches)
        if updates < asked:
            trainer.log_every_n_steps = updates
            rank_zero_info(
                f"convseq: an epoch has {updates} updates, fewer than "
                f"trainer.log_every_n_steps={asked}: per-update figures are logged every "
                f"{updates} updates"
            )
