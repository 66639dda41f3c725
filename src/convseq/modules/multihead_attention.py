"""Multi-head encoder-decoder attention, fairseq 0.12's MultiheadAttention (its cross-attention
use) in plain PyTorch: the same parameter names (``q_proj``, ``k_proj``, ``v_proj``,
``out_proj``, each with a bias), the same initialisation and the same order of operations.

Each of H heads attends with scaled dot products ``softmax(q k^T / sqrt(D))`` over the source
positions (padded keys get no weight), the heads' contexts are concatenated and projected by
``out_proj``. In incremental decoding the projected encoder keys and values are computed once
and kept in the caller's ``incremental_state``.
"""

from __future__ import annotations

import math
import uuid

import torch
import torch.nn.functional as F
from torch import nn

from convseq.modules.linearized_conv import IncrementalState


class MultiheadAttention(nn.Module):
    """Attention of (T, B, E) queries over (S, B, kdim) keys and (S, B, vdim) values.

    Args:
        embed_dim: E, the query and output channels (a multiple of ``num_heads``).
        num_heads: H; each head works on D = E / H channels.
        kdim, vdim: channels of the keys and values (default E).
        dropout: dropout on the attention probabilities (training only).
        bias: biases in the four projections.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        kdim: int | None = None,
        vdim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
    ):
        super().__init__()
        if num_heads < 1 or embed_dim % num_heads:
            raise ValueError(f"num_heads: must divide embed_dim = {embed_dim}, got {num_heads}")
        self.embed_dim = embed_dim
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self.qkv_same_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = dropout
        # built in fairseq's order (k, v, q, out), so that one seed draws fairseq's values
        self.k_proj = nn.Linear(self.kdim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(self.vdim, embed_dim, bias=bias)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        # names this module's entry in an incremental_state shared by the whole decoder
        self._state_key = f"{uuid.uuid4().hex}.attn_state"
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """fairseq's init: Xavier-uniform projections (gain 1/sqrt(2) for q, k, v when their
        sizes agree), zero ``out_proj`` bias; the q/k/v biases keep PyTorch's default draw."""
        gain = 1 / math.sqrt(2) if self.qkv_same_dim else 1.0
        for proj in (self.k_proj, self.v_proj, self.q_proj):
            nn.init.xavier_uniform_(proj.weight, gain=gain)
        nn.init.xavier_uniform_(self.out_proj.weight)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None = None,
        incremental_state: IncrementalState | None = None,
        need_weights: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(T, B, E) queries -> (T, B, E) output and, with ``need_weights``, the (B, T, S)
        attention probabilities averaged over heads (float32, as fairseq's).

        Args:
            key_padding_mask: (B, S) True (or 1) at padded source positions.
            incremental_state: with it, keys and values are projected on the first call and
                reused afterwards (the source is static); ``key``/``value`` may then be None.
        """
        length, rows, _ = query.shape
        heads, dim = self.num_heads, self.head_dim
        k, v, key_padding_mask = self._keys_values(key, value, key_padding_mask, incremental_state)
        sources = k.size(2)
        q = self.q_proj(query) * self.scaling  # (T, B, E)
        q = q.contiguous().view(length, rows * heads, dim).transpose(0, 1)  # (B*H, T, D)
        scores = torch.bmm(q, k.reshape(rows * heads, sources, dim).transpose(1, 2))  # (B*H, T, S)
        if key_padding_mask is not None:
            scores = scores.view(rows, heads, length, sources)  # (B, H, T, S)
            pads = key_padding_mask.to(torch.bool)[:, None, None, :]  # (B, 1, 1, S)
            scores = scores.masked_fill(pads, float("-inf")).view(rows * heads, length, sources)
        probs_float = F.softmax(scores, dim=-1, dtype=torch.float32)  # (B*H, T, S)
        probs = F.dropout(probs_float.type_as(scores), self.dropout, self.training)
        context = torch.bmm(probs, v.reshape(rows * heads, sources, dim))  # (B*H, T, D)
        context = context.transpose(0, 1).contiguous().view(length, rows, self.embed_dim)
        out = self.out_proj(context)  # (T, B, E)
        if not need_weights:
            return out, None
        weights = probs_float.view(rows, heads, length, sources).mean(dim=1)  # (B, T, S)
        return out, weights

    def _keys_values(
        self,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        incremental_state: IncrementalState | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Projected keys and values (B, H, S, D) and the padding mask, from the cache if any."""
        if incremental_state is not None:
            cached = incremental_state.get(self._state_key)
            if cached is not None:
                assert isinstance(cached, tuple)
                return cached
        if key is None or value is None:
            raise ValueError("key and value are needed unless an incremental state holds them")
        sources, rows, _ = key.shape
        shape = (sources, rows, self.num_heads, self.head_dim)
        k = self.k_proj(key).view(shape).permute(1, 2, 0, 3)  # (B, H, S, D)
        v = self.v_proj(value).view(shape).permute(1, 2, 0, 3)  # (B, H, S, D)
        if incremental_state is not None:
            incremental_state[self._state_key] = (k, v, key_padding_mask)
        return k, v, key_padding_mask

    def reorder_incremental_state(
        self, incremental_state: IncrementalState, new_order: torch.Tensor
    ) -> None:
        """Keep row ``new_order[i]``'s cached keys, values and mask as row ``i``."""
        cached = incremental_state.get(self._state_key)
        if cached is None:
            return
        assert isinstance(cached, tuple)
        k, v, mask = cached
        mask = None if mask is None else mask.index_select(0, new_order)  # (B', S)
        incremental_state[self._state_key] = (
            k.index_select(0, new_order),  # (B', H, S, D)
            v.index_select(0, new_order),  # (B', H, S, D)
            mask,
        )

    def extra_repr(self) -> str:
        return f"{self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"
