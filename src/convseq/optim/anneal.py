"""Learning-rate annealing, epoch by epoch: fairseq's plateau and force-anneal rules, the Lua rule.

`Annealer` is a small state machine with plain-value state (ints, floats, bools, None), kept
apart from Lightning's scheduler hooks so that a resumed run continues it exactly. Epochs are
1-based, as in fairseq (Lightning's ``current_epoch`` + 1). A trainer drives it like this::

    annealer = Annealer(cfg.anneal, lr=cfg.optim.lr)
    for epoch in 1, 2, ...:
        lr = annealer.lr_at_epoch_start(epoch)      # set it on the optimiser
        if annealer.should_stop(lr):                # lr < min_lr: log annealer.stop_reason
            break
        train one epoch; val_loss = validate
        annealer.step(epoch, val_loss)              # the lr for epoch + 1

Strategies (``anneal.name``):

- ``plateau``: fairseq's reduce_lr_on_plateau (torch's ReduceLROnPlateau, mode min, rel
  threshold, cooldown 0). A validation loss is better when ``val < best * (1 - lr_threshold)``;
  after more than ``lr_patience`` consecutive validations that are not better,
  ``lr = lr * lr_shrink`` and the count restarts. As in torch, a shrink by no more than 1e-8 is
  skipped.
- ``force``: fairseq's fixed schedule with ``--force-anneal``. Convention: fairseq's current one
  (since November 2020, v0.10): the lr used *during* epoch e is ``lr`` for e < force_anneal and
  ``lr * lr_shrink ** (e + 1 - force_anneal)`` from e = force_anneal on, so epoch force_anneal
  is the first annealed epoch. fairseq 2018 - v0.9 (and fairseq-py 2017) annealed one epoch
  later; ``force_anneal = N + 1`` here reproduces their ``--force-anneal N`` exactly.
- ``lua``: the Lua toolkit's rule. After each validation of an epoch e >= min_epoch_to_anneal:
  if annealing has begun, or the loss is no better than the *previous* epoch's
  (``prev <= val``), ``lr = lr * lr_shrink`` and annealing has begun (the previous loss is then
  left as it was); otherwise the loss becomes the previous one. Once begun, the lr shrinks every
  epoch whatever the loss does.
- ``none``: a constant lr.
- ``inverse_sqrt``, ``cosine``: schedules by update (`convseq.optim.warmup`); here, as ``none``.

Every strategy stops when ``lr < min_lr`` (strict: an lr equal to min_lr is still used).
plateau and lua shrink by repeated multiplication ``lr * lr_shrink`` (the Lua toolkit divided by
10; the last bit may differ), force uses fairseq's power expression above; these choices fix the
float values that decide the stopping epoch. ``min_lr <= 0`` never stops, which is what current
fairseq does unless ``--stop-min-lr`` is given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from convseq.errors import CheckpointError
from convseq.optim.build import OptimConfigError, number
from convseq.optim.config import AnnealConfig
from convseq.optim.warmup import UPDATE_SCHEDULES

# the epoch rules, then the schedules by update (convseq.optim.warmup), which keep the lr
# through the epoch rules' steps and set it before every update instead
STRATEGIES = ("plateau", "force", "lua", "none", *UPDATE_SCHEDULES)

# torch's ReduceLROnPlateau ignores a reduction of no more than this (its ``eps``).
_PLATEAU_EPS = 1e-8

_STATE_KEYS = (
    "lr",
    "base_lr",
    "last_epoch",
    "best",
    "num_bad_epochs",
    "prev_val",
    "annealing",
)


class Annealer:
    """The lr schedule of one run, stepped once per epoch after validation.

    Args:
        cfg: the `anneal` config.
        lr: the initial learning rate (``optim.lr``).

    Raises:
        OptimConfigError: an unknown ``anneal.name`` or a bad value, named by its key.
    """

    def __init__(self, cfg: AnnealConfig, lr: float) -> None:
        self.name: str = cfg.name
        if self.name not in STRATEGIES:
            raise OptimConfigError(
                f"anneal.name={self.name!r} is not an annealing strategy convseq knows; choose "
                f"one of {', '.join(STRATEGIES)} (e.g. anneal=plateau on the command line)"
            )
        self.lr_shrink = number(cfg.lr_shrink, "anneal.lr_shrink", 0.0)
        if self.name in ("plateau", "force", "lua") and not 0.0 < self.lr_shrink < 1.0:
            raise OptimConfigError(
                f"anneal.lr_shrink must lie in (0, 1), got {self.lr_shrink!r}: lr is multiplied "
                "by it (the Lua toolkit's divisor -lrshrink 10 is lr_shrink 0.1)"
            )
        self.lr_threshold = number(cfg.lr_threshold, "anneal.lr_threshold", 0.0)
        self.lr_patience = int(number(cfg.lr_patience, "anneal.lr_patience", 0))
        self.min_epoch_to_anneal = int(
            number(cfg.min_epoch_to_anneal, "anneal.min_epoch_to_anneal", 0)
        )
        self.min_lr = number(cfg.min_lr, "anneal.min_lr", -math.inf)
        force_anneal = cfg.force_anneal
        if self.name == "force" and (
            isinstance(force_anneal, bool) or not isinstance(force_anneal, int) or force_anneal < 1
        ):
            raise OptimConfigError(
                f"anneal.force_anneal must be an epoch >= 1 for anneal=force, got "
                f"{force_anneal!r} (e.g. anneal.force_anneal=50)"
            )
        self.force_anneal: int | None = force_anneal
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr >= 0.0:
            raise OptimConfigError(f"optim.lr must be a number >= 0, got {lr!r}")

        self.base_lr = float(lr)  # the configured lr, the base of the force table
        self.lr = float(lr)  # the lr for the coming (or current) epoch
        self.last_epoch = 0  # the last epoch passed to step()
        self.best: float | None = None  # plateau: best validation loss so far
        self.num_bad_epochs = 0  # plateau: validations in a row that were not better
        self.prev_val: float | None = None  # lua: the loss annealing is compared against
        self.annealing = False  # lua: shrinking every epoch from now on
        self.stop_reason: str | None = None

    def _force_lr(self, epoch: int) -> float:
        assert self.force_anneal is not None
        if epoch < self.force_anneal:
            return self.base_lr
        return self.base_lr * self.lr_shrink ** (epoch + 1 - self.force_anneal)

    def lr_at_epoch_start(self, epoch: int) -> float:
        """The lr to train epoch ``epoch`` (1-based) with; calling it twice is harmless."""
        if epoch < 1:
            raise ValueError(f"epochs are 1-based, got {epoch}")
        if self.name == "force":
            self.lr = self._force_lr(epoch)
        return self.lr

    def step(self, epoch: int, val_loss: float | None) -> float:
        """Take the validation loss of epoch ``epoch``; return the lr for epoch ``epoch + 1``.

        Args:
            epoch: the 1-based epoch just trained and validated.
            val_loss: its validation loss, or None when there was no validation (plateau and
                lua then keep the lr, except that lua keeps shrinking once annealing has begun).
        """
        if epoch < 1:
            raise ValueError(f"epochs are 1-based, got {epoch}")
        self.last_epoch = epoch
        val = None if val_loss is None else float(val_loss)
        if self.name == "force":
            self.lr = self._force_lr(epoch + 1)
        elif self.name == "plateau" and val is not None:
            self._plateau(val)
        elif self.name == "lua":
            self._lua(epoch, val)
        return self.lr

    def _plateau(self, val: float) -> None:
        if self.best is None or val < self.best * (1.0 - self.lr_threshold):
            self.best = val
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.num_bad_epochs > self.lr_patience:
            new_lr = self.lr * self.lr_shrink
            if self.lr - new_lr > _PLATEAU_EPS:
                self.lr = new_lr
            self.num_bad_epochs = 0

    def _lua(self, epoch: int, val: float | None) -> None:
        if epoch < self.min_epoch_to_anneal:
            if val is not None:
                self.prev_val = val
            return
        # prev <= val, written so that a NaN loss also counts as no improvement
        worse = val is not None and self.prev_val is not None and not val < self.prev_val
        if self.annealing or worse:
            self.lr = self.lr * self.lr_shrink
            self.annealing = True
        elif val is not None:
            self.prev_val = val

    def should_stop(self, lr: float | None = None) -> bool:
        """Whether ``lr`` (default: the current lr) is below min_lr; sets `stop_reason` if so."""
        lr = self.lr if lr is None else float(lr)
        if lr < self.min_lr:
            self.stop_reason = (
                f"lr {lr:.6g} fell below anneal.min_lr {self.min_lr:g} "
                f"({self.name} annealing, after epoch {self.last_epoch})"
            )
            return True
        return False

    def state_dict(self) -> dict[str, int | float | bool | None]:
        """The schedule's state as plain values (loadable with ``torch.load(weights_only=True)``)."""
        return {key: getattr(self, key) for key in _STATE_KEYS}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state from `state_dict`.

        Raises:
            CheckpointError: a key is missing.
        """
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise CheckpointError(
                f"annealing state lacks {missing}; it was not written by convseq's Annealer"
            )
        self.lr = float(state["lr"])
        self.base_lr = float(state["base_lr"])
        self.last_epoch = int(state["last_epoch"])
        self.best = None if state["best"] is None else float(state["best"])
        self.num_bad_epochs = int(state["num_bad_epochs"])
        self.prev_val = None if state["prev_val"] is None else float(state["prev_val"])
        self.annealing = bool(state["annealing"])
        self.stop_reason = None
