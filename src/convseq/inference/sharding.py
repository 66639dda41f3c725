"""Translation spread over the processes of a distributed run (DDP ranks), gathered in input order.

A split is batched once, exactly as one process would batch it; rank ``r`` of ``W`` translates
batches ``r, r + W, r + 2W, ...`` of that list. Every sentence is therefore translated in the
same batch, with the same padding, as in a one-process run, so the hypotheses (and any score
computed from them) are the one-process ones bit for bit; the ranks only split the work. The
pieces are then gathered, on every rank, in input order.

Outside a distributed run (or with one process) everything here is the identity.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import torch.distributed as dist

from convseq.common.distributed import rank_and_world

T = TypeVar("T")


def shard(items: Sequence[T], rank: int, world: int) -> list[T]:
    """Rank ``rank``'s share of ``items``: every ``world``-th one, starting at ``rank``."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not one of {world} processes")
    return list(items[rank::world])


class BatchList:
    """A fixed list of batches (lists of sentence indices), usable as a DataLoader's
    ``batch_sampler``: the shape Lightning's predict loop expects of one."""

    def __init__(self, batches: Sequence[Sequence[int]]):
        self.batches = [list(b) for b in batches]

    def __iter__(self) -> Iterator[list[int]]:
        return iter([list(b) for b in self.batches])

    def __len__(self) -> int:
        return len(self.batches)


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (``[obj]`` outside a distributed run).

    Pickled over the process group (``all_gather_object``): for the small objects of
    generation, such as (sentence id, text) pairs or translation records.
    """
    _, world = rank_and_world()
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (``obj`` itself outside a distributed run)."""
    _, world = rank_and_world()
    if world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
