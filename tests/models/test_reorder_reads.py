"""The decoder's reorder decides on the host whether its cached encoder output must be copied.

A beam search reorders the decoder state at every step; comparing the cached copies on the device
and reading the verdict back would stall a GPU's queue each time. Under the search's
`block_reorder` promise the decoder reads its row groups once per cache and decides every later
step from host values, with the decisions and outputs of the device comparison.
"""

from __future__ import annotations

import pytest
import torch

from convseq.modules.reorder import block_reorder
from tests.models.test_fconv import left_padded, prefixes, rel, small_model
from tests.search.host_reads import HostReads

BEAM = 3


def within_beams(n_sent: int, g: torch.Generator) -> torch.Tensor:
    """(n_sent * BEAM,) each row continues a row of its own sentence, not all in place."""
    pick = torch.randint(0, BEAM, (n_sent, BEAM), generator=g)
    pick[:, 0] = (pick[:, 0] + 1) % BEAM  # row 0 of each sentence moves
    return (torch.arange(n_sent).unsqueeze(1) * BEAM + pick).flatten()


def decode(model, src, prev, events, promise: bool):
    """Incremental decoding with reorders before some steps.

    ``events`` maps a step to (new_order, the blocks the new blocks continue or None). Returns
    per step (logits, original rows), per event whether the cache was copied, and per event
    the host reads the reorder made.
    """
    key = model.decoder._cache_key
    enc = model.encoder(src, None)
    state: dict = {}
    rows, history = torch.arange(src.size(0)), prev
    outputs, copied, reads = [], [], []
    with torch.no_grad():
        for t in range(prev.size(1)):
            if t in events:
                order, sources = events[t]
                before = state[key]
                with HostReads() as counted:
                    if promise:
                        with block_reorder(BEAM, sources):
                            model.reorder_incremental_state(state, order)
                    else:
                        model.reorder_incremental_state(state, order)
                reads.append(counted.total)
                copied.append(state[key] is not before)
                enc = model.encoder.reorder_encoder_out(enc, order)
                rows, history = rows[order], history[order]
            logits, _ = model.decoder(history[:, : t + 1], enc, state)
            outputs.append((logits[:, 0], rows))
    return outputs, copied, reads


def events_of_a_search(g: torch.Generator) -> dict:
    """Reorders as a beam search makes them, and one that swaps two sentences' blocks."""
    return {
        2: (within_beams(3, g), None),
        4: (within_beams(3, g), None),
        6: (torch.cat([torch.arange(0, 3), torch.arange(6, 9)]), [0, 2]),  # sentence 1 leaves
        8: (within_beams(2, g), None),
        10: (torch.tensor([3, 4, 5, 0, 1, 2]), [1, 0]),  # the two sentences swap blocks
        12: (within_beams(2, g), None),
    }


def test_promised_reorders_read_the_host_once_and_decide_as_the_device_comparison():
    model = small_model().eval()
    src = left_padded([6, 9, 8]).repeat_interleave(BEAM, dim=0)  # (9, S): beam copies
    prev = prefixes(9, 14)
    promised = decode(model, src, prev, events_of_a_search(torch.Generator().manual_seed(4)), True)
    compared = decode(model, src, prev, events_of_a_search(torch.Generator().manual_seed(4)), False)
    outputs, copied, reads = promised
    # one read (the row groups, to the host) at the first reorder, none after
    assert reads == [1, 0, 0, 0, 0, 0]
    assert copied == [False, False, True, False, True, False]
    assert copied == compared[1]
    for (a, rows_a), (b, rows_b) in zip(outputs, compared[0], strict=True):
        assert torch.equal(rows_a, rows_b) and torch.equal(a, b)
    full, _ = model(src, None, prev)  # teacher forced: no cache at all
    assert max(rel(logits, full[rows, t]) for t, (logits, rows) in enumerate(outputs)) <= 1e-5


def test_a_reorder_changing_the_row_count_copies_without_a_read():
    model = small_model().eval()
    src = left_padded([6, 9, 8]).repeat_interleave(BEAM, dim=0)
    prev = prefixes(9, 6)
    events = {
        2: (torch.arange(9), None),  # in place: found equal by the comparison (one read)
        3: (torch.cat([torch.arange(0, 3), torch.arange(6, 9)]), None),  # shrink
        4: (torch.tensor([0, 0, 1, 2, 3, 4, 5, 5]), None),  # grow
    }
    _, copied, reads = decode(model, src, prev, events, promise=False)
    assert copied == [False, True, True]
    assert reads == [1, 0, 0]


def test_rows_holding_different_copies_fall_back_to_the_device_comparison():
    model = small_model().eval()
    src = left_padded([6, 9, 8, 7, 5, 6])  # six different sentences: blocks of 3 are mixed
    prev = prefixes(6, 6)
    events = {
        2: (torch.tensor([0, 1, 2, 3, 4, 5]), None),
        4: (torch.tensor([1, 1, 2, 3, 4, 5]), None),
    }
    outputs, copied, reads = decode(model, src, prev, events, promise=True)
    assert copied == [False, True]  # row 0 receives row 1's copy at step 4
    assert reads == [2, 1]  # the groups to the host, then one comparison per reorder
    full, _ = model(src, None, prev)
    assert max(rel(logits, full[rows, t]) for t, (logits, rows) in enumerate(outputs)) <= 1e-5


def test_a_reorder_breaking_the_block_promise_is_refused():
    model = small_model().eval()
    src = left_padded([6, 9]).repeat_interleave(BEAM, dim=0)
    enc = model.encoder(src, None)
    state: dict = {}
    with torch.no_grad():
        model.decoder(prefixes(6, 1), enc, state)
        with pytest.raises(ValueError, match="2 blocks of 3"), block_reorder(BEAM, [0, 1]):
            model.reorder_incremental_state(state, torch.arange(3))
