"""Sinusoidal positions of a batch without padding come as a view of the table, equal to the
gathered positions (the decoder's prefix in generation takes this path at every step)."""

from __future__ import annotations

import torch

from convseq.modules.positional import SinusoidalPositionalEmbedding, make_positions


def test_unpadded_positions_are_the_table_rows_without_a_gather():
    emb = SinusoidalPositionalEmbedding(16, padding_idx=1, init_size=10)
    tokens = torch.randint(4, 50, (3, 7))  # (B, T), no pad
    gathered = emb.weights.index_select(0, make_positions(tokens, 1).view(-1)).view(3, 7, 16)
    out = emb(tokens)
    assert torch.equal(out, gathered)
    assert out.data_ptr() == emb.weights[2].data_ptr()  # a view: nothing copied
    tokens[0, :2] = 1  # left padding: gathered per row
    expected = emb.weights.index_select(0, make_positions(tokens, 1).view(-1)).view(3, 7, 16)
    assert torch.equal(emb(tokens), expected)
