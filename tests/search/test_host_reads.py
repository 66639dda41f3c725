"""The searches read device data on the host a fixed number of times, not once per step or
hypothesis beyond what they must (see `tests.search.host_reads` for what counts as a read).

The tensorized beam search reads one (bsz, beam) tensor per step, the finished scores, from the
first step at which a hypothesis may end; greedy decoding reads one flag per step (all done?).
Everything else is read once per batch.
"""

from __future__ import annotations

import sys

import pytest
import torch

import convseq.search.beam as beam_module
import convseq.search.finished as finished_module
from convseq.search import beam_search, greedy
from convseq.search.run import index_tensor
from tests.search.host_reads import HostReads
from tests.search.test_search import LENGTHS, batch, sharp_model


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def endless_model():
    """A model under which no hypothesis ends before its maximum length (EOS far behind)."""
    return sharp_model(eos_bias=-100.0)


def reads_of(search, *args, **kwargs) -> tuple[int, list]:
    with HostReads() as reads:
        out = search(*args, **kwargs)
    return reads.total, out


@pytest.mark.parametrize("beam", [2, 5])
def test_beam_search_reads_the_finished_scores_once_per_step_and_nothing_else(beam):
    model = endless_model()
    src, lengths = batch(LENGTHS)
    # every sentence ends at max_len_b (max_len_a = 0): max_len_b + 1 steps
    short, out_short = reads_of(beam_search, model, src, lengths, beam=beam, max_len_b=3)
    long, out_long = reads_of(beam_search, model, src, lengths, beam=beam, max_len_b=11)
    assert {len(h[0]["tokens"]) for h in out_short} == {4}
    assert {len(h[0]["tokens"]) for h in out_long} == {12}
    assert long - short == 8  # one read per extra step
    # no hypothesis can end before min_len: no step before it reads anything
    short, _ = reads_of(beam_search, model, src, lengths, beam=beam, max_len_b=3, min_len=3)
    long, _ = reads_of(beam_search, model, src, lengths, beam=beam, max_len_b=11, min_len=11)
    assert long == short <= 4


def test_beam_search_reads_do_not_grow_with_the_beam_or_nbest():
    model = endless_model()
    src, lengths = batch(LENGTHS)
    counts = {
        (beam, nbest): reads_of(
            beam_search, model, src, lengths, beam=beam, nbest=nbest, max_len_b=6
        )[0]
        for beam, nbest in ((1, 1), (3, 1), (6, 1), (6, 6))
    }
    assert len(set(counts.values())) == 1, counts


def test_beam_search_queues_its_index_lists_without_waiting_for_the_device(monkeypatch):
    """Host lists (finished rows, kept sentences, sentences at their limit) reach the device
    through `index_tensor`, never through a blocking ``torch.tensor(..., device=...)``."""
    direct, queued = [], []
    tensor = torch.tensor
    searches = (beam_module, finished_module)  # the tensorized search's modules

    def watched_tensor(*args, **kwargs):
        if sys._getframe(1).f_globals.get("__name__") in {m.__name__ for m in searches}:
            direct.append(args)
        return tensor(*args, **kwargs)

    def watched_index(values, device):
        queued.append(list(values))
        return index_tensor(values, device)

    monkeypatch.setattr(torch, "tensor", watched_tensor)
    for module in searches:
        monkeypatch.setattr(module, "index_tensor", watched_index)
    src, lengths = batch(LENGTHS)
    out = beam_search(sharp_model(), src, lengths, beam=4, nbest=2, max_len_a=0.5, max_len_b=6)
    assert len(out) == len(LENGTHS)
    assert direct == []
    # finished rows at many steps, kept sentences and sentences at their limit all went there
    assert len(queued) >= 5


def test_index_tensor_holds_the_values_on_the_device():
    t = index_tensor([3, 0, 7], torch.device("cpu"))
    assert t.dtype == torch.long and t.device.type == "cpu" and t.tolist() == [3, 0, 7]
    assert index_tensor([], torch.device("cpu")).shape == (0,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_index_tensor_does_not_synchronise_a_cuda_device():
    device = torch.device("cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        t = index_tensor([3, 0, 7], device)
        with pytest.raises(RuntimeError):  # what a plain copy from host memory does
            torch.tensor([3, 0, 7], device=device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert t.device.type == "cuda" and t.tolist() == [3, 0, 7]


def test_greedy_reads_one_flag_per_step_and_nothing_per_sentence():
    model = endless_model()
    src, lengths = batch(LENGTHS)
    short, out = reads_of(greedy, model, src, lengths, max_len_b=3)
    long, _ = reads_of(greedy, model, src, lengths, max_len_b=11)
    assert {len(h[0]["tokens"]) for h in out} == {4}
    assert long - short == 8  # the "all done?" flag of each extra step
    few, _ = reads_of(greedy, model, src[:2], lengths[:2], max_len_b=3)
    assert few == short  # the scores of all sentences come back in one read
