"""Under DDP every rank decides for itself what `resume` means; they must have decided alike.

Each rank resolves `resume` (`convseq.checkpoints.io.resolve_resume`) from the run folder before
the process group exists. With `resume=auto` a rank that cannot see the folder's last.ckpt (a run
folder on a disk of one machine only, not shared by the others) would start afresh while the
others continue: `ResumeAgreement` compares the ranks' choices once the group is up, before any
checkpoint is restored, and stops every rank with the same clear error if they differ.
"""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl

from convseq.errors import CheckpointError
from convseq.inference.sharding import gather_objects

__all__ = ["ResumeAgreement", "check_agreement"]


def check_agreement(choices: list[str | None], setting: object) -> None:
    """Raise CheckpointError unless every rank's checkpoint (None: a new run) is the same.

    Args:
        choices: each rank's checkpoint path (or None), in rank order.
        setting: the `resume` value, for the message.
    """
    if len(set(choices)) <= 1:
        return
    seen = "; ".join(
        f"rank {rank}: {choice or 'no checkpoint (new run)'}" for rank, choice in enumerate(choices)
    )
    raise CheckpointError(
        f"resume={setting}: the ranks found different checkpoints to continue from ({seen}); "
        "put the run folder (hydra.run.dir) on a file system every machine shares"
    )


class ResumeAgreement(pl.Callback):
    """Checks at `setup` (the process group is up, nothing restored yet) that all ranks chose
    the same checkpoint `resume` resolved to (None: a new run)."""

    def __init__(self, resume: Path | None, setting: object) -> None:
        self.resume = str(resume) if resume is not None else None
        self.setting = setting

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.world_size > 1:
            check_agreement(gather_objects(self.resume), self.setting)
