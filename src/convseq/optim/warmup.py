"""Learning-rate schedules by update: a linear warm-up, then inverse square root or cosine decay.

The epoch rules of `convseq.optim.anneal` change the lr after validations; these change it before
every update, as fairseq's `inverse_sqrt` and `cosine` schedulers do (the schedules Adam is
usually trained with). The lr of update ``u`` (1-based, updates the fp16 loss scaler skipped not
counted) is a function of ``u`` alone, so a resumed run continues it exactly.

- ``inverse_sqrt``: ``warmup_init_lr`` rising linearly to ``lr`` over ``warmup_updates``, then
  ``lr * sqrt(warmup_updates / u)`` (fairseq's ``--lr-scheduler inverse_sqrt``).
- ``cosine``: the same warm-up, then half a cosine from ``lr`` down to ``min_lr`` at update
  ``total_updates``, where training stops (fairseq's ``cosine`` with one period, no restarts).
"""

from __future__ import annotations

import math

from convseq.optim.build import OptimConfigError
from convseq.optim.config import AnnealConfig

__all__ = ["UPDATE_SCHEDULES", "UpdateSchedule", "check_update_schedule"]

UPDATE_SCHEDULES = ("inverse_sqrt", "cosine")


class UpdateSchedule:
    """The lr of every update of an ``inverse_sqrt`` or ``cosine`` schedule.

    Args:
        cfg: the `anneal` config (its name, warmup_updates, warmup_init_lr, min_lr and
            total_updates).
        lr: the peak learning rate (``optim.lr``).
        max_update: the run's ``max_update``, the cosine's length when ``total_updates`` is 0.

    Raises:
        OptimConfigError: a bad value, named by its key.
    """

    def __init__(self, cfg: AnnealConfig, lr: float, max_update: int = 0) -> None:
        self.name = cfg.name
        if self.name not in UPDATE_SCHEDULES:
            raise OptimConfigError(f"anneal.name={self.name!r} is not a schedule by update")
        self.lr = float(lr)
        self.warmup = cfg.warmup_updates
        self.init_lr = float(cfg.warmup_init_lr)
        self.min_lr = max(float(cfg.min_lr), 0.0)
        self.total = cfg.total_updates or max_update
        if self.warmup < 0 or (self.name == "inverse_sqrt" and self.warmup < 1):
            raise OptimConfigError(
                f"anneal.warmup_updates must be >= 1 for anneal={self.name}, got {self.warmup} "
                "(the decay is lr * sqrt(warmup_updates / update); e.g. anneal.warmup_updates=1000)"
            )
        if not 0.0 <= self.init_lr <= self.lr:
            raise OptimConfigError(
                f"anneal.warmup_init_lr must lie in [0, optim.lr={self.lr:g}], got {self.init_lr}"
            )
        if self.name == "cosine" and self.total <= self.warmup:
            raise OptimConfigError(
                f"anneal=cosine decays until anneal.total_updates (or max_update), which must "
                f"exceed anneal.warmup_updates={self.warmup}; got {self.total} (e.g. "
                "anneal.total_updates=5000)"
            )

    def lr_at(self, update: int) -> float:
        """The lr of update `update` (1-based)."""
        u = max(int(update), 1)
        if u <= self.warmup:
            return self.init_lr + (self.lr - self.init_lr) * u / self.warmup
        if self.name == "inverse_sqrt":
            return self.lr * math.sqrt(self.warmup / u)
        done = min((u - self.warmup) / (self.total - self.warmup), 1.0)  # cosine: 0 .. 1
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * done))

    def finished(self, updates_done: int) -> str | None:
        """The stop reason once a cosine schedule has run its `total` updates, else None."""
        if self.name == "cosine" and updates_done >= self.total:
            return f"the cosine schedule ended at update {self.total} (anneal.total_updates)"
        return None


def check_update_schedule(cfg: AnnealConfig, lr: float, max_update: int = 0) -> None:
    """Refuse a bad ``inverse_sqrt`` / ``cosine`` setting (`UpdateSchedule`'s checks) at once,
    before a run prepares its data; other schedules are checked by their own rule."""
    if cfg.name in UPDATE_SCHEDULES:
        UpdateSchedule(cfg, lr=lr, max_update=max_update)
