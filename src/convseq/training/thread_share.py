"""Threads per process, settled once the process group is up: each rank counts the ranks of the
run that share its CPUs (`convseq.common.threads.local_share`).

Before the group exists a process knows only LOCAL_WORLD_SIZE or trainer.devices: two torchrun
"nodes" started on one machine each see LOCAL_WORLD_SIZE=1 and would take every core. Lightning's
DDP launcher also sets torch's threads to its own number as it starts; this callback's `setup`
runs after that, in every rank, and sets the run's number again. A number the rule made from
the CPUs then follows other work on them (`convseq.inference.cpu_share_callback`).
"""

from __future__ import annotations

import logging
import socket

import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_info

from convseq.common.threads import ThreadChoice, affinity, apply_threads, local_share
from convseq.inference.cpu_share_callback import CpuShareCallback
from convseq.inference.sharding import gather_objects

log = logging.getLogger("convseq.train")  # the header's logger: stdout and run.log

__all__ = ["ThreadShare"]


class ThreadShare(CpuShareCallback):
    """Applies `choice` in every rank, refined by the ranks found on each host, then follows
    other work on the process's CPUs where the rule made the number.

    Args:
        choice: the number chosen before the Trainer started (`choose_threads`).
    """

    def __init__(self, choice: ThreadChoice) -> None:
        super().__init__(None, say=log.info)
        self.choice = choice

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        choice = self.choice
        if trainer.world_size > 1:
            peers = gather_objects((socket.gethostname(), frozenset(affinity())))
            choice = local_share(choice, peers, trainer.global_rank)
        apply_threads(choice)
        if choice != self.choice:
            rank_zero_info(f"convseq: threads per process: {choice.threads} ({choice.source})")
            self.choice = choice
        self.follow(choice)
