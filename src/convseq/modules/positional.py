"""Learned positional embeddings, numbered the way fairseq numbers them."""

from __future__ import annotations

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
