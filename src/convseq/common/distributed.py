"""This process's place in a distributed run (DDP ranks)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


def rank_and_world(trainer: Any = None) -> tuple[int, int]:
    """(this process' rank, the number of processes): the Trainer's when one is given, else the
    default process group's; (0, 1) when no distributed run is going on."""
    if trainer is not None:
        return int(trainer.global_rank), int(trainer.world_size)
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
