"""The fconv decoder: causal gated convolutions with multi-step attention, and the vocabulary head."""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from convseq.common.specials import PAD_ID
from convseq.models.config import ModelConfigError
from convseq.models.encoder import EncoderOut
from convseq.models.spec import LayerSpec
from convseq.models.stack import conv_stack
from convseq.modules.attention import AttentionLayer
from convseq.modules.layers import linear, linearized_conv1d
from convseq.modules.linearized_conv import IncrementalState
from convseq.modules.reorder import current_block_reorder

SQRT_HALF = math.sqrt(0.5)

# keys, values, padding mask, and (training) the device flag of whether the mask holds a pad
EncoderCache = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


class FConvDecoder(nn.Module):
    """fairseq's FConvDecoder (right-padded, EOS-first input; incremental decoding).

    The layout follows ``incremental_state``, never ``self.training`` (a validation loss in
    eval mode is still teacher-forced): time-major (T, B, C) over a full sequence, (B, 1, C)
    for one incremental step.

    Args:
        num_embeddings: target vocabulary size (the dictionary's length, padding included).
        embed_dim: token and position embedding size E.
        out_embed_dim: fc2's output size D (input of the vocabulary projection fc3).
        layers: one ``(channels, kernel, residual)`` per layer (`convseq.models.spec`).
        attention: one bool per layer: whether the layer attends over the source.
        dropout: dropout probability (after the embeddings, before every conv, after fc2).
        max_positions: rows of the position table (usable length: rows - pad - 1).
        share_embed: tie fc3's weight to the token embeddings (needs D == E).
        padding_idx: the pad symbol.
    """

    def __init__(
        self,
        num_embeddings: int,
        embed_dim: int,
        out_embed_dim: int,
        layers: Sequence[LayerSpec],
        attention: Sequence[bool],
        dropout: float,
        max_positions: int = 1024,
        share_embed: bool = False,
        padding_idx: int = PAD_ID,
    ):
        super().__init__()
        # fairseq's state-dict version: 2 = conv weight norm over the output channels (dim 2)
        self.register_buffer("version", torch.Tensor([2]))
        self.dropout = dropout
        self.padding_idx = padding_idx
        self.need_attn = True  # average the attention weights in eval mode
        self.layer_specs = tuple(layers)
        if len(attention) != len(self.layer_specs):
            raise ModelConfigError(
                f"model.decoder_attention: {len(attention)} entries for "
                f"{len(self.layer_specs)} decoder layers"
            )
        uid = uuid.uuid4().hex
        self._cache_key = f"{uid}.encoder_out"
        self._groups_key = f"{uid}.encoder_out_groups"  # rows holding identical cached copies

        def conv(in_channels: int, out_channels: int, kernel: int) -> nn.Module:
            return linearized_conv1d(in_channels, out_channels * 2, kernel, dropout=dropout)

        def attention_layer(i: int, out_channels: int) -> nn.Module | None:
            return AttentionLayer(out_channels, embed_dim) if attention[i] else None

        stack = conv_stack(
            num_embeddings,
            embed_dim,
            max_positions,
            padding_idx,
            self.layer_specs,
            dropout,
            conv,
            attention_layer,
        )
        self.embed_tokens, self.embed_positions = stack.embed_tokens, stack.embed_positions
        self.fc1 = stack.fc1
        self.projections, self.convolutions = stack.projections, stack.convolutions
        self.attention = stack.extras
        self.residuals = stack.residuals

        self.fc2 = linear(stack.out_channels, out_embed_dim)
        self.fc3 = _vocabulary_projection(
            out_embed_dim, num_embeddings, dropout, self.embed_tokens if share_embed else None
        )

    def forward(
        self,
        prev_output_tokens: torch.Tensor,
        encoder_out: EncoderOut,
        incremental_state: IncrementalState | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits for every position (teacher forcing) or for the newest one (incremental).

        Args:
            prev_output_tokens: (B, T) EOS-first, right-padded target prefix. In incremental
                mode, the whole prefix so far (its length gives the position); only its last
                token is read.
            encoder_out: the encoder's output for these rows. In incremental mode it is read
                on the first step only and cached (reordered with the state afterwards).
            incremental_state: a dict owned by the caller, empty at the first step.

        Returns:
            (B, T, V) logits (T = 1 in incremental mode) and the (B, T, S) attention averaged
            over layers in eval mode when ``need_attn``, else None.
        """
        features, attn = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        return self.output_layer(features), attn

    def extract_features(
        self,
        prev_output_tokens: torch.Tensor,
        encoder_out: EncoderOut,
        incremental_state: IncrementalState | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The convolution stack's output, (B, T, C_last), and the averaged attention."""
        incremental = incremental_state is not None
        keys, values, mask, any_pad = self._encoder_cache(encoder_out, incremental_state)

        positions = self.embed_positions(prev_output_tokens, incremental=incremental)
        if incremental:
            prev_output_tokens = prev_output_tokens[:, -1:]  # (B, 1)
        x = self.embed_tokens(prev_output_tokens) + positions  # (B, T, E)
        x = F.dropout(x, p=self.dropout, training=self.training)
        target_embedding = x  # (B, T, E), shared by every attention layer
        x = self.fc1(x)  # (B, T, C0)
        if not incremental:
            x = x.transpose(0, 1)  # (T, B, C0): time-major for conv_tbc

        avg_attn = None
        num_layers = len(self.attention)  # fairseq divides by all layers, attending or not
        residuals = [x]
        for proj, conv, attention, res in zip(
            self.projections, self.convolutions, self.attention, self.residuals, strict=True
        ):
            if res > 0:
                residual = residuals[-res]
                residual = residual if proj is None else proj(residual)
            else:
                residual = None
            x = F.dropout(x, p=self.dropout, training=self.training)
            x = conv(x, incremental_state)  # (T, B, 2C) or (B, 1, 2C)
            x = F.glu(x, dim=2)  # first half values, second half gates
            if attention is not None:
                if not incremental:
                    x = x.transpose(0, 1)  # (B, T, C)
                x, attn = attention(x, target_embedding, (keys, values), mask, any_pad)
                if not self.training and self.need_attn:
                    attn = attn / num_layers  # (B, T, S)
                    avg_attn = attn if avg_attn is None else avg_attn + attn
                if not incremental:
                    x = x.transpose(0, 1)  # (T, B, C)
            if residual is not None:
                x = (x + residual) * SQRT_HALF
            residuals.append(x)

        if not incremental:
            x = x.transpose(0, 1)  # (B, T, C_last)
        return x, avg_attn

    def output_layer(self, features: torch.Tensor) -> torch.Tensor:
        """fc2, dropout, fc3: (B, T, C_last) -> (B, T, V) logits."""
        x = self.fc2(features)  # (B, T, D)
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.fc3(x)  # (B, T, V)

    def _encoder_cache(
        self, encoder_out: EncoderOut, incremental_state: IncrementalState | None
    ) -> EncoderCache:
        """Keys pre-transposed to (B, E, S) for the attention bmm, values (B, S, E), mask.

        Cached in the incremental state, so generation transposes once per sentence.
        """
        if incremental_state is not None:
            cached = incremental_state.get(self._cache_key)
            if cached is not None:
                return cached
        x, y = encoder_out["encoder_out"]
        mask, any_pad = encoder_out["encoder_padding_mask"], encoder_out.get("encoder_has_padding")
        result = (x.transpose(1, 2).contiguous(), y, mask, any_pad)
        if incremental_state is not None:
            incremental_state[self._cache_key] = result
        return result

    def reorder_incremental_state(
        self, incremental_state: IncrementalState, new_order: torch.Tensor
    ) -> None:
        """Make row i continue row ``new_order[i]``: conv buffers and the cached encoder output.

        ``new_order`` may repeat rows (beam expansion) or drop them (finished sentences). The
        cached encoder output is copied only when some row would receive different values:
        in beam search every beam of a sentence holds the same copy, so hypotheses moving
        within their sentence's beam (every step but those that shrink the batch) leave it
        as it is. Which rows hold equal copies is found once, by comparing them.

        Whether a row would receive a different copy is decided on the host when it can be:
        a changed row count always copies, and under `convseq.modules.reorder.block_reorder`
        (the beam search's promise of how rows move) the copy each block holds is read to
        the host once per cache, after which no step reads the device. Any other reorder
        compares the copies on the device and reads the verdict (one host read).
        """
        for conv in self.convolutions:
            conv.reorder_incremental_state(incremental_state, new_order)
        cached = incremental_state.get(self._cache_key)
        if cached is None:
            return
        groups = incremental_state.get(self._groups_key)
        if groups is None:
            groups = _RowGroups(_equal_row_groups(cached))
        hint = current_block_reorder()
        if hint is not None:
            groups = groups.for_blocks(hint.size)
        if hint is not None and groups.block_ids is not None:
            blocks = groups.block_ids
            moved_blocks = (
                blocks if hint.sources is None else tuple(blocks[s] for s in hint.sources)
            )
            if new_order.size(0) != hint.size * len(moved_blocks):
                raise ValueError(
                    f"reorder to {new_order.size(0)} rows inside a block_reorder promising "
                    f"{len(moved_blocks)} blocks of {hint.size}"
                )
            if moved_blocks == blocks:  # host tuples: no device read
                incremental_state[self._groups_key] = groups
                return
            moved = _RowGroups(groups.ids.index_select(0, new_order), hint.size, moved_blocks)
        else:
            moved_ids = groups.ids.index_select(0, new_order)  # (B',) the copy each row should hold
            # a changed row count is known from the shapes; equal ones need a read of the verdict
            if moved_ids.shape == groups.ids.shape and torch.equal(moved_ids, groups.ids):
                incremental_state[self._groups_key] = groups
                return  # every row already holds the values it would receive: nothing to copy
            moved = _RowGroups(moved_ids)
        incremental_state[self._cache_key] = tuple(
            None if t is None else t.index_select(0, new_order) for t in cached
        )
        incremental_state[self._groups_key] = moved

    def get_normalized_probs(
        self, net_output: tuple[torch.Tensor, object] | torch.Tensor, log_probs: bool = True
    ) -> torch.Tensor:
        """(Log-)probabilities from the decoder's output, computed in fp32."""
        logits = net_output[0] if isinstance(net_output, tuple) else net_output
        logits = logits.float()
        return F.log_softmax(logits, dim=-1) if log_probs else F.softmax(logits, dim=-1)

    def max_positions(self) -> int:
        """The longest target (in tokens, EOS included) the position table can number."""
        return self.embed_positions.max_positions


class _RowGroups(NamedTuple):
    """Which rows of a cached encoder output hold equal copies."""

    ids: torch.Tensor  # (B,) on the cache's device: rows with equal ids hold equal values
    block_size: int = 0  # the block size `block_ids` was read for; 0: not read yet
    # on the host, the id of each block of `block_size` rows; None if a block mixes copies
    block_ids: tuple[int, ...] | None = None

    def for_blocks(self, size: int) -> _RowGroups:
        """These groups with each block's id on the host: read once per cache and block size."""
        if self.block_size == size:
            return self
        ids = self.ids.tolist()  # the one host read of this cache's groups
        firsts = tuple(ids[::size])
        uniform = len(ids) % size == 0 and all(g == firsts[i // size] for i, g in enumerate(ids))
        return self._replace(block_size=size, block_ids=firsts if uniform else None)


def _equal_row_groups(tensors: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """(B,) group ids: consecutive rows equal in every tensor share one, any other row differs.

    Exact value comparison, one pass over the tensors (NaN never equals: such rows stay
    apart; -0.0 counts as equal to 0.0: the attention's products and sums give equal values
    for either). Only neighbours are compared, which finds the beam copies of a sentence.
    """
    present = [t for t in tensors if t is not None]
    rows = present[0].size(0)
    same = torch.ones(max(rows - 1, 0), dtype=torch.bool, device=present[0].device)  # (B-1,)
    for t in present:
        same &= (t[1:] == t[:-1]).flatten(1).all(dim=1)  # row i+1 equals row i
    starts = torch.cat([same.new_ones(min(rows, 1)), ~same])  # (B,) True where a group begins
    return starts.cumsum(0)  # (B,) long


def _vocabulary_projection(
    out_embed_dim: int, num_embeddings: int, dropout: float, tied: nn.Embedding | None
) -> nn.Module:
    """fc3, from fc2's D outputs to the vocabulary: weight-normed, or with ``tied`` (the token
    embeddings, under ``share_embed``) a Linear whose weight is theirs (needs D == E)."""
    if tied is None:
        return linear(out_embed_dim, num_embeddings, dropout=dropout)
    embed_dim = tied.embedding_dim
    if out_embed_dim != embed_dim:
        raise ModelConfigError(
            "model.share_input_output_embed needs decoder_out_embed_dim == "
            f"decoder_embed_dim, got {out_embed_dim} and {embed_dim}"
        )
    # fairseq: a plain Linear (no weight norm, default bias init) tied to the embeddings
    fc3 = nn.Linear(out_embed_dim, num_embeddings)
    fc3.weight = tied.weight
    return fc3
