"""Learned and sinusoidal positional embeddings, numbered the way fairseq numbers them."""

from __future__ import annotations

import math

import torch
from torch import nn


def make_positions(tokens: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """Positions of a (B, T) token batch: pad + 1, pad + 2, ... over real tokens, pad at pads.

    Counting only real tokens makes the numbering the same on whichever side the padding is.
    """
    mask = tokens.ne(padding_idx).int()  # (B, T)
    return (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + padding_idx  # (B, T)


class LearnedPositionalEmbedding(nn.Embedding):
    """A table of ``num_embeddings`` learned position vectors; the row ``padding_idx`` is 0.

    Positions start at ``padding_idx + 1``, so ``num_embeddings - padding_idx - 1`` positions
    are usable (1022 for fairseq's 1024-row tables with pad = 1).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx)

    @property
    def max_positions(self) -> int:
        """The longest sequence this table can number."""
        return self.num_embeddings - self.padding_idx - 1

    def forward(self, tokens: torch.Tensor, incremental: bool = False) -> torch.Tensor:
        """Position embeddings for a (B, T) token batch.

        Args:
            tokens: (B, T) token ids; in incremental mode, the whole prefix decoded so far.
            incremental: embed only the newest position, ``pad + T``, as a (B, 1, E) tensor
                (the prefix holds no padding during generation).
        """
        length = tokens.size(1)
        if length > self.max_positions:
            raise ValueError(
                f"a sequence of {length} tokens exceeds the {self.max_positions} positions "
                "of this model (max_source_positions / max_target_positions); shorten or "
                "filter it"
            )
        if incremental:
            positions = tokens.new_full((tokens.size(0), 1), self.padding_idx + length)  # (B, 1)
        else:
            positions = make_positions(tokens, self.padding_idx)  # (B, T)
        return super().forward(positions)  # (B, T or 1, E)


def sinusoidal_table(num_embeddings: int, embedding_dim: int, padding_idx: int) -> torch.Tensor:
    """The (num_embeddings, embedding_dim) sinusoid table fairseq builds (tensor2tensor's form):
    row p is [sin(p * f_0) .. sin(p * f_{h-1}), cos(p * f_0) .. cos(p * f_{h-1})] with
    h = dim // 2, f_i = exp(-i * ln(10000) / (h - 1)), a zero column when dim is odd, and the
    row ``padding_idx`` zero."""
    half = embedding_dim // 2
    step = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float) * -step)  # (h,)
    angles = torch.arange(num_embeddings, dtype=torch.float).unsqueeze(1) * freqs.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)  # (N, 2h)
    if embedding_dim % 2 == 1:
        table = torch.cat([table, torch.zeros(num_embeddings, 1)], dim=1)  # (N, E)
    table[padding_idx, :] = 0
    return table


class SinusoidalPositionalEmbedding(nn.Module):
    """Fixed sinusoidal positions numbered as `LearnedPositionalEmbedding`'s (pad + 1, ...).

    The table is a non-persistent buffer (no state_dict entry, as fairseq 0.12's) that grows
    when a longer sequence comes.
    """

    weights: torch.Tensor

    def __init__(self, embedding_dim: int, padding_idx: int, init_size: int = 1024):
        super().__init__()
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        table = sinusoidal_table(init_size, embedding_dim, padding_idx)
        self.register_buffer("weights", table, persistent=False)
        self.max_positions = int(1e5)

    def forward(self, tokens: torch.Tensor, incremental: bool = False) -> torch.Tensor:
        """Position embeddings for a (B, T) token batch: (B, T, E), or (B, 1, E) for the
        newest position ``pad + T`` when ``incremental``."""
        bsz, length = tokens.shape
        needed = self.padding_idx + 1 + length
        if needed > self.weights.size(0):
            table = sinusoidal_table(needed, self.embedding_dim, self.padding_idx)
            self.weights = table.to(self.weights)
        if incremental:
            return self.weights[self.padding_idx + length].expand(bsz, 1, -1)  # (B, 1, E)
        if not bool(tokens.eq(self.padding_idx).any()):
            # no padding (a decoder's prefix in generation): every row numbers pad + 1 .. pad + T,
            # a view of the table; gathering B * T rows at every step would copy them all
            first = self.padding_idx + 1
            return self.weights[first : first + length].expand(bsz, -1, -1).detach()  # (B, T, E)
        positions = make_positions(tokens, self.padding_idx)  # (B, T)
        return self.weights.index_select(0, positions.view(-1)).view(bsz, length, -1).detach()
