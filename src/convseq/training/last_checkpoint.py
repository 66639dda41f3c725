"""best.ckpt and last.ckpt: Lightning's ModelCheckpoint, with last.ckpt at every save point."""

from __future__ import annotations

import os
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint

__all__ = ["BestAndLast"]


class BestAndLast(ModelCheckpoint):
    """A ModelCheckpoint whose `last.ckpt` is written at every save point (each epoch's end, or
    each validation with `save_on_train_epoch_end=False`), whether the monitored value improved
    or not.

    Lightning 2.6 writes `last.ckpt` only where it also wrote a top-k checkpoint: once valid BLEU
    stopped improving, `last.ckpt` stayed at the best epoch, so a killed run resumed epochs
    behind and a finished one, continued with a larger budget, redid the epochs after its best.

    A run folder that was moved or copied (another path, another machine) resumes with its best
    score: Lightning forgets it when the checkpoint's `dirpath` differs from the callback's, so the
    first validation after the resume overwrote best.ckpt with a worse model.
    """

    def _generate_state_key(self, **kwargs: Any) -> str:
        # ModelCheckpoint's key in the checkpoint's callback states, so that checkpoints written
        # before this class existed resume their best score and paths, and the other way round
        return f"ModelCheckpoint{kwargs!r}"

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(_moved(state_dict, self.dirpath))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._last_too(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._last_too(trainer)

    def _last_too(self, trainer: pl.Trainer) -> None:
        """last.ckpt, unless this step's was just written (with the best) or nothing may be."""
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


def _moved(state: dict[str, Any], dirpath: str | None) -> dict[str, Any]:
    """`state` with its checkpoint paths in `dirpath` when the folder it names was moved there:
    its best checkpoint (or last, for a last-only callback) is in `dirpath` under the same name.
    Otherwise `state` as it is (a new folder without that file starts its best afresh, as
    Lightning does)."""
    old = state.get("dirpath")
    kept = state.get("best_model_path") or state.get("last_model_path") or ""
    if not old or not dirpath or old == dirpath or os.path.dirname(kept) != old:
        return state
    if not os.path.isfile(os.path.join(dirpath, os.path.basename(kept))):
        return state

    def here(path: Any) -> Any:
        if isinstance(path, str) and os.path.dirname(path) == old:
            return os.path.join(dirpath, os.path.basename(path))
        return path

    moved = {key: here(value) for key, value in state.items()}
    moved["dirpath"] = dirpath
    moved["best_k_models"] = {here(k): v for k, v in (state.get("best_k_models") or {}).items()}
    return moved
