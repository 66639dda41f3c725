"""What a `ConvSeqModule` keeps in its checkpoints, and how it is loaded from one.

`ModuleCheckpoint` is a mixin of `convseq.training.module.ConvSeqModule`: the run's own state
(the epoch's running sums, the timers, the per-epoch history and every validation) saved beside
Lightning's, so that a resumed run continues its figures exactly, and a weights-only
`load_from_checkpoint` that names a bad file.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytorch_lightning as pl
import torch

from convseq.checkpoints.io import TEXT_KEY, is_refused, read_error
from convseq.errors import CheckpointError

STATE_KEY = "convseq"  # the module's own entry in a checkpoint


class ModuleCheckpoint:
    """The checkpoint hooks of `ConvSeqModule` (which sets the attributes they read)."""

    def training_seconds(self) -> float:
        """Wall time spent in `fit` so far, over every process of a resumed run."""
        return self._total_carry + time.perf_counter() - self._t_fit

    def command_seconds(self) -> float:
        """Wall time since the command started (`convseq.common.clock`), over every process of
        a resumed run (each one's time up to its last checkpoint)."""
        return self._command_carry + time.monotonic() - self.command_started

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        now = time.perf_counter()
        checkpoint[STATE_KEY] = {
            "epoch_sums": self._epoch_sums.detach().cpu().clone(),
            "epoch_updates": int(self._epoch_updates),
            "epoch_lr": float(self._epoch_lr),
            "epoch_train_seconds": float(self._epoch_train_seconds),
            "epoch_wall_seconds": float(self._epoch_wall_carry + now - self._t_epoch),
            "total_seconds": float(self._total_carry + now - self._t_fit),
            "command_seconds": float(self.command_seconds()),
            "history": [dict(h) for h in self.history],
            "validations": [dict(v) for v in self.validations],
            "skipped_updates": int(self.skipped_updates),
        }
        if self.text_processing is not None:
            checkpoint[TEXT_KEY] = self.text_processing

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.text_processing = checkpoint.get(TEXT_KEY, self.text_processing)
        state = checkpoint.get(STATE_KEY)
        if state is None:
            return
        self._epoch_sums = state["epoch_sums"].to(torch.float64).clone()
        self._epoch_updates = int(state["epoch_updates"])
        self._epoch_lr = float(state["epoch_lr"])
        self._epoch_train_seconds = float(state["epoch_train_seconds"])
        self._epoch_wall_carry = float(state["epoch_wall_seconds"])
        self._total_carry = float(state["total_seconds"])
        self._command_carry = float(state.get("command_seconds", state["total_seconds"]))
        self.history = [dict(h) for h in state["history"]]
        self.validations = [dict(v) for v in state.get("validations", [])]
        self.skipped_updates = int(state.get("skipped_updates", 0))

    @classmethod
    def load_from_checkpoint(  # type: ignore[override]
        cls, checkpoint_path: str, map_location: Any = None, **kwargs: Any
    ) -> pl.LightningModule:
        """Load a trained module, weights-only; a bad file raises CheckpointError naming it.

        `weights_only` is always True: a file whose pickle references anything but tensors and
        plain values is refused, never unpickled (whatever torch's environment variables say).
        """
        if kwargs.pop("weights_only", True) is not True:
            raise ValueError("convseq loads checkpoints weights-only (weights_only=True) only")
        if not os.path.isfile(checkpoint_path):
            raise CheckpointError(f"{checkpoint_path}: no such checkpoint file")
        try:
            return super().load_from_checkpoint(
                checkpoint_path, map_location=map_location, weights_only=True, **kwargs
            )
        except Exception as e:  # weights-only loading ran no code from the file
            if is_refused(e):
                raise read_error(checkpoint_path, e) from None
            lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()][:2]
            raise CheckpointError(
                f"{checkpoint_path}: cannot load a ConvSeqModule: not a convseq checkpoint, or a "
                f"damaged one ({type(e).__name__}: {' '.join(lines)[:300]}); convseq checkpoints "
                "come from task=train (last.ckpt, best.ckpt) or task=import_fairseq"
            ) from e
