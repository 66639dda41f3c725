"""The Lightning side of `convseq.common.cpu_share`: between two steps of training, validation
or translation, the number of threads the watcher asks for, and a line when it changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl

from convseq.common.cpu_share import CpuShare, follows
from convseq.common.threads import ThreadChoice, affinity

__all__ = ["CpuShareCallback"]


class CpuShareCallback(pl.Callback):
    """Follows the other work on this process's CPUs (a choice the rule made; see
    `convseq.common.cpu_share`).

    Args:
        choice: this process's thread choice; followed only when `follows` says so.
        say: where a change is told (a line without the "convseq: " prefix).
    """

    def __init__(self, choice: ThreadChoice | None, say: Callable[[str], None] = print) -> None:
        self.share: CpuShare | None = None
        self.say = say
        if choice is not None:
            self.follow(choice)

    def follow(self, choice: ThreadChoice) -> None:
        """Start (again) from `choice`: a watcher when the choice follows the load, else none."""
        self.stop()
        if follows(choice.source, choice.threads):
            self.share = CpuShare(choice.threads, affinity()).start()

    def stop(self) -> None:
        if self.share is not None:
            self.share.stop()
            self.share = None

    def _step(self) -> None:
        line = None if self.share is None else self.share.step()
        if line is not None:
            self.say(line)

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        self._step()

    def on_validation_batch_start(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        self._step()

    def on_predict_batch_start(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        self._step()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.stop()
