"""Multi-head encoder-decoder attention, fairseq 0.12's MultiheadAttention (its cross-attention
use) in plain PyTorch: the same parameter names (``q_proj``, ``k_proj``, ``v_proj``,
``out_proj``, each with a bias), the same initialisation and the same order of operations.

Each of H heads attends with scaled dot products ``softmax(q k^T / sqrt(D))`` over the source
positions (padded keys get no weight), the heads' contexts are concatenated and projected by
``out_proj``. In incremental decoding the projected encoder keys and values are computed once
and kept in the caller's ``incremental_state``.
"""

from __future__ import annotations

import itertools
import math
import uuid

import torch
import torch.nn.functional as F
from torch import nn

from convseq.modules.linearized_conv import IncrementalState
from convseq.modules.reorder import current_block_reorder


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
                Rows of the source that are equal in consecutive groups (a beam search's copies
                of a sentence) are projected and kept once per group (see `_group_size`).
        """
        length, rows, _ = query.shape
        heads, dim = self.num_heads, self.head_dim
        k, v, key_padding_mask = self._keys_values(key, value, key_padding_mask, incremental_state)
        groups, sources = k.size(0), k.size(2)  # U groups of g = B / U query rows share keys
        g = rows // groups
        q = self.q_proj(query) * self.scaling  # (T, B, E)
        # (U * H, g * T, D): each group's g rows side by side, against its one copy of the keys
        q = q.view(length, groups, g, heads, dim).permute(1, 3, 2, 0, 4)  # (U, H, g, T, D)
        q = q.reshape(groups * heads, g * length, dim)
        scores = torch.bmm(q, k.view(groups * heads, sources, dim).transpose(1, 2))  # (UH, gT, S)
        if key_padding_mask is not None:
            scores = scores.view(groups, heads, g * length, sources)  # (U, H, g * T, S)
            pads = key_padding_mask.to(torch.bool)[:, None, None, :]  # (U, 1, 1, S)
            scores = scores.masked_fill(pads, float("-inf")).view(groups * heads, -1, sources)
        probs_float = F.softmax(scores, dim=-1, dtype=torch.float32)  # (U * H, g * T, S)
        probs = F.dropout(probs_float.type_as(scores), self.dropout, self.training)
        context = torch.bmm(probs, v.view(groups * heads, sources, dim))  # (U * H, g * T, D)
        context = context.view(groups, heads, g, length, dim).permute(3, 0, 2, 1, 4)
        out = self.out_proj(context.reshape(length, rows, self.embed_dim))  # (T, B, E)
        if not need_weights:
            return out, None
        weights = probs_float.view(groups, heads, g, length, sources).mean(dim=1)  # (U, g, T, S)
        return out, weights.view(rows, length, sources)

    def _keys_values(
        self,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        incremental_state: IncrementalState | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Projected keys and values (U, H, S, D) and the (U, S) padding mask, from the cache if
        any: one per group of g equal consecutive rows (U = B / g; g = 1 without a cache)."""
        if incremental_state is not None:
            cached = incremental_state.get(self._state_key)
            if cached is not None:
                assert isinstance(cached, tuple)
                return cached[:3]
        if key is None or value is None:
            raise ValueError("key and value are needed unless an incremental state holds them")
        g = 1
        if incremental_state is not None and value is key:
            g = _group_size(key, key_padding_mask)
            # why: a beam search feeds every sentence's encoder output beam times; projecting
            # one copy saves (g - 1) / g of the largest product of the first step
            key = value = key[:, ::g]  # (S, U, E)
            key_padding_mask = None if key_padding_mask is None else key_padding_mask[::g]
        sources, rows, _ = key.shape
        shape = (sources, rows, self.num_heads, self.head_dim)
        # contiguous once here, rather than copied by a reshape at every step
        k = self.k_proj(key).view(shape).permute(1, 2, 0, 3).contiguous()  # (U, H, S, D)
        v = self.v_proj(value).view(shape).permute(1, 2, 0, 3).contiguous()  # (U, H, S, D)
        if incremental_state is not None:
            incremental_state[self._state_key] = (k, v, key_padding_mask, g)
        return k, v, key_padding_mask

    def reorder_incremental_state(
        self, incremental_state: IncrementalState, new_order: torch.Tensor
    ) -> None:
        """Keep row ``new_order[i]``'s cached keys, values and mask as row ``i``.

        The cache holds one copy per group of g rows: a reorder that keeps every row in its
        group (a beam search's step, promised by `block_reorder` or found by one comparison)
        copies nothing; one that keeps whole groups (sentences leaving the batch) copies the
        groups kept; any other ends the sharing (g = 1).
        """
        cached = incremental_state.get(self._state_key)
        if cached is None:
            return
        assert isinstance(cached, tuple)
        k, v, mask, g = cached
        groups, g = _groups_kept(new_order, k.size(0), g)
        if groups is None:
            return
        incremental_state[self._state_key] = (
            k.index_select(0, groups),  # (U', H, S, D)
            v.index_select(0, groups),  # (U', H, S, D)
            None if mask is None else mask.index_select(0, groups),  # (U', S)
            g,
        )

    def extra_repr(self) -> str:
        return f"{self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"


def _group_size(key: torch.Tensor, mask: torch.Tensor | None) -> int:
    """The largest g such that the (S, B, E) ``key`` rows (and ``mask`` rows) are equal within
    each block of g consecutive rows: the greatest common divisor of the runs of equal rows."""
    rows = key.size(1)
    if rows < 2:
        return 1
    same = (key[:, 1:] == key[:, :-1]).flatten(2).all(dim=2).all(dim=0)  # (B - 1,)
    if mask is not None:
        same &= (mask[1:] == mask[:-1]).all(dim=1)
    starts = [0, *(torch.nonzero(~same).view(-1) + 1).tolist(), rows]
    return math.gcd(*(b - a for a, b in itertools.pairwise(starts)))


def _groups_kept(new_order: torch.Tensor, groups: int, g: int) -> tuple[torch.Tensor | None, int]:
    """Which of the ``groups`` cached copies, each shared by g consecutive rows, the reordered
    rows read, and the new rows' group size: (None, g) when every row reads its own group as
    before; (index, g) when whole groups are kept (some dropped); (per-row index, 1) otherwise."""
    hint = current_block_reorder()
    if hint is not None and g == hint.size:  # the caller's promise, read on the host
        if hint.sources is None:
            return None, g
        return torch.tensor(hint.sources, dtype=torch.long, device=new_order.device), g
    read = torch.div(new_order, g, rounding_mode="floor")  # (B',): the group each row reads
    if new_order.size(0) % g == 0:
        blocks = read.view(-1, g)  # (U', g)
        if bool((blocks == blocks[:, :1]).all()):
            first = blocks[:, 0]  # (U',)
            unchanged = first.size(0) == groups and bool(
                (first == torch.arange(groups, device=first.device)).all()
            )
            return (None if unchanged else first), g
    return read, 1
