"""Validation and checkpoints by updates, for epochs of hours.

``validate_interval_updates=N`` (fairseq's ``--validate-interval-updates``) validates every N
updates, counted over the whole run (not per epoch), instead of at the end of every epoch.
``save_interval_updates=M`` (``--save-interval-updates``) writes ``checkpoints/updateUUUUUUU.ckpt``
every M updates; as in fairseq, a save is also a validation, so M must be a multiple of N when
both are set, and M alone validates every M updates. The last ``checkpoint.keep_interval_updates``
of those files are kept (fairseq's ``--keep-interval-updates``; -1 keeps all).

Each update checkpoint is written right after its validation (and after the annealing step that
follows it), so it holds the state an uninterrupted run has at that point, and a run resumed from
it continues in the middle of the epoch exactly as the uninterrupted run did.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_only

from convseq.errors import ConvseqError
from convseq.training.config import TrainConfig

UPDATE_FILE = re.compile(r"update(\d+)\.ckpt")  # UpdateCheckpoint's names


class IntervalError(ConvseqError, ValueError):
    """validate_interval_updates / save_interval_updates that cannot work together."""


def validation_interval(cfg: TrainConfig) -> int:
    """Updates between validations (0: validate at the end of every epoch, as by default).

    Raises:
        IntervalError: a negative interval, or a save interval that is not a multiple of the
            validation interval (every save is also a validation).
    """
    validate, save = cfg.validate_interval_updates, cfg.save_interval_updates
    if validate < 0 or save < 0:
        raise IntervalError(
            f"validate_interval_updates={validate}, save_interval_updates={save}: give numbers "
            "of updates >= 0 (0 = off)"
        )
    if validate and save and save % validate:
        raise IntervalError(
            f"save_interval_updates={save} is not a multiple of validate_interval_updates="
            f"{validate}: every saved checkpoint is also a validation; choose e.g. "
            f"save_interval_updates={validate * max(save // validate, 1)}"
        )
    return validate or save


def trainer_arguments(cfg: TrainConfig) -> dict[str, Any]:
    """Trainer arguments for validations by updates (none when validating by epochs).

    Lightning counts training batches, so an interval of N updates is N x
    ``accumulate_grad_batches`` batches, counted across epochs (``check_val_every_n_epoch``
    None).
    """
    interval = validation_interval(cfg)
    if not interval:
        return {}
    accumulate = max(cfg.trainer.accumulate_grad_batches, 1)
    return {"val_check_interval": interval * accumulate, "check_val_every_n_epoch": None}


class UpdateCheckpoint(pl.Callback):
    """Writes ``updateUUUUUUU.ckpt`` after every validation that ends an update multiple of
    ``every``, and keeps the newest ``keep`` of them (-1: all).

    Args:
        dirpath: the checkpoints folder.
        every: save_interval_updates.
        keep: checkpoint.keep_interval_updates.
    """

    def __init__(self, dirpath: str | Path, every: int, keep: int = -1):
        self.dirpath = Path(dirpath)
        self.every = int(every)
        self.keep = int(keep)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.every <= 0:
            return
        updates = int(getattr(pl_module, "updates", trainer.global_step))
        if updates <= 0 or updates % self.every:
            return
        trainer.save_checkpoint(self.dirpath / f"update{updates:07d}.ckpt", weights_only=False)
        self._prune()

    @rank_zero_only
    def _prune(self) -> None:
        if self.keep < 0:
            return
        found = sorted(
            (int(m.group(1)), p)
            for p in self.dirpath.glob("update*.ckpt")
            if (m := UPDATE_FILE.fullmatch(p.name))
        )
        for _, path in found[: max(len(found) - self.keep, 0)]:
            path.unlink(missing_ok=True)
