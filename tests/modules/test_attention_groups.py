"""Encoder attention's cache of keys and values, one copy per group of equal consecutive rows (a
beam search's copies of a sentence): it gives the per-row outputs through every kind of
reorder, and copies nothing where rows stay in their group."""

from __future__ import annotations

import contextlib

import pytest
import torch

from convseq.modules.multihead_attention import MultiheadAttention, _group_size
from convseq.modules.reorder import block_reorder

E, H, S, SENTENCES, BEAM = 16, 4, 5, 3, 2


def _setup():
    torch.manual_seed(0)
    attn = MultiheadAttention(E, H).eval()
    enc = torch.randn(S, SENTENCES, E)  # (S, B, E)
    mask = torch.zeros(SENTENCES, S, dtype=torch.bool)  # (B, S)
    mask[1, :2] = True  # one left-padded sentence
    expand = torch.arange(SENTENCES).repeat_interleave(BEAM)  # (B * beam,)
    return attn, enc.index_select(1, expand), mask.index_select(0, expand)


def _reference(attn, query, enc, mask, rows):
    """Per row, without a cache: row i attends over encoder row rows[i]."""
    out, weights = attn(query, enc.index_select(1, rows), enc.index_select(1, rows), mask[rows])
    return out, weights


def _step(attn, state, query, enc, mask):
    return attn(query, enc, enc, key_padding_mask=mask, incremental_state=state)


@pytest.mark.parametrize("hinted", [False, True])
def test_reorders_within_and_across_groups_give_the_per_row_outputs(hinted):
    attn, enc, mask = _setup()
    state: dict = {}
    rows = torch.arange(SENTENCES * BEAM)
    query = torch.randn(1, rows.numel(), E)  # (T, B, E)
    got = _step(attn, state, query, enc, mask)
    torch.testing.assert_close(got, _reference(attn, query, enc, mask, rows))
    assert state[attn._state_key][0].size(0) == SENTENCES  # one copy of each sentence's keys
    # within groups: rows swap inside each beam, nothing is copied
    within = torch.tensor([1, 0, 2, 2, 5, 4])
    keys = state[attn._state_key][0]
    with block_reorder(BEAM) if hinted else contextlib.nullcontext():
        attn.reorder_incremental_state(state, within)
    assert state[attn._state_key][0] is keys
    rows = rows[within]
    # sentence 1 leaves the batch: its group is dropped
    drop = torch.tensor([0, 1, 4, 5])
    with block_reorder(BEAM, [0, 2]) if hinted else contextlib.nullcontext():
        attn.reorder_incremental_state(state, drop)
    rows = rows[drop]
    assert state[attn._state_key][0].size(0) == 2
    query = torch.randn(1, rows.numel(), E)
    torch.testing.assert_close(_step(attn, state, query, None, None), _ref(attn, query, rows))
    # rows mixing groups: the sharing ends, each row its own copy
    mixed = torch.tensor([0, 2, 1, 3])
    attn.reorder_incremental_state(state, mixed)
    rows = rows[mixed]
    assert state[attn._state_key][0].size(0) == 4
    query = torch.randn(2, rows.numel(), E)
    torch.testing.assert_close(_step(attn, state, query, None, None), _ref(attn, query, rows))


def _ref(attn, query, rows):
    _, enc, mask = _setup()
    return _reference(attn, query, enc, mask, rows)


def test_group_size_is_the_gcd_of_runs_of_equal_rows_and_masks_count():
    torch.manual_seed(0)
    enc = torch.randn(S, 2, E)
    same_twice = enc[:, [0, 0, 0, 0, 1, 1]]  # sentence 0 twice, then sentence 1: runs 4, 2
    assert _group_size(same_twice, None) == 2
    mask = torch.zeros(6, S, dtype=torch.bool)
    mask[1, 0] = True  # equal states, unequal masks: rows 0 and 1 do not share
    assert _group_size(same_twice, mask) == 1
    assert _group_size(enc, None) == 1 and _group_size(enc[:, :1], None) == 1
