"""Attention products computed once per sentence instead of once per beam copy (BeamableMM)."""

from __future__ import annotations

import torch


def beamable_bmm(a: torch.Tensor, b: torch.Tensor, beam_size: int | None) -> torch.Tensor:
    """``torch.bmm(a, b)`` for a single decoding step, sharing ``b`` within each beam.

    During beam search the rows come in blocks of ``beam_size`` copies of one sentence, and
    every copy of an encoder tensor ``b`` in a block is identical. Instead of ``B`` matrix-vector
    products against ``B`` copies, this does ``B / beam`` matrix-matrix products against the
    block's first copy: the same FLOPs, ``beam`` times less memory traffic. It assumes (and
    does not check: that would cost a comparison as large as the product) that the copies are
    equal; otherwise, or when the shapes do not fit, it falls back to ``torch.bmm``.

    Args:
        a: (B, 1, X) one query row per hypothesis.
        b: (B, X, Y) the per-row encoder tensor.
        beam_size: the number of consecutive rows sharing ``b``; None or 1 = plain bmm.

    Returns:
        (B, 1, Y), equal to ``torch.bmm(a, b)`` when the copies are equal.
    """
    rows = a.size(0)
    if beam_size is None or beam_size <= 1 or a.size(1) != 1 or rows % beam_size != 0:
        return torch.bmm(a, b)
    sentences = rows // beam_size
    queries = a.reshape(sentences, beam_size, a.size(2))  # (B/beam, beam, X)
    shared = b[::beam_size]  # (B/beam, X, Y) a strided view: the first copy of each block
    out = torch.bmm(queries, shared)  # (B/beam, beam, Y)
    return out.reshape(rows, 1, b.size(2))  # (B, 1, Y)
