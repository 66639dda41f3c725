"""What a caller knows about a reorder's rows, so that caches can decide on the host.

A beam search keeps each sentence's hypotheses in one block of ``size`` consecutive rows, and it
knows on the host which block of the old order each new block continues: the same one on an
ordinary step (hypotheses move within their sentence's beam), fewer blocks once sentences finish.
``new_order`` itself lives on the device. A cache holding one copy of per-sentence data per row
(the decoder's encoder output) would otherwise have to compare ``new_order``'s effect on the
device and read the verdict back, which stalls a GPU's queue at every step.

    with block_reorder(beam, kept_blocks):  # None: every block continues itself
        model.reorder_incremental_state(state, new_order)

Inside the block, every ``new_order`` passed on must keep this promise: row ``i`` continues a
row of old block ``sources[i // size]`` (``i // size`` when ``sources`` is None), and it has
``size * len(sources)`` rows (as many as before when ``sources`` is None).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import NamedTuple


class BlockReorder(NamedTuple):
    """How a reorder moves rows, in blocks of ``size`` rows (see the module docstring)."""

    size: int
    sources: tuple[int, ...] | None  # new block j continues old block sources[j]; None: itself


# a context variable, not an argument: it reaches the decoder through any wrapper (an ensemble,
# an adapter) without changing fairseq's reorder_incremental_state(state, new_order) interface
_CURRENT: ContextVar[BlockReorder | None] = ContextVar("convseq_block_reorder", default=None)


@contextlib.contextmanager
def block_reorder(size: int, sources: Sequence[int] | None = None) -> Iterator[BlockReorder]:
    """Promise, for the reorders inside, that rows move in blocks of ``size`` (module docstring).

    Args:
        size: rows per block (the beam).
        sources: per new block, the old block it continues; None: each block continues itself.
    """
    if size < 1:
        raise ValueError(f"size: a block holds at least one row, got {size}")
    hint = BlockReorder(size, None if sources is None else tuple(sources))
    token = _CURRENT.set(hint)
    try:
        yield hint
    finally:
        _CURRENT.reset(token)


def current_block_reorder() -> BlockReorder | None:
    """The promise made by the innermost enclosing `block_reorder`, or None."""
    return _CURRENT.get()
