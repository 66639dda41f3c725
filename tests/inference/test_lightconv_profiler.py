"""`gen.profile=true` on a LightConv decoder: its convolutions, encoder attention and output
projection timed by hooks, as fconv's are (test_profiler.py runs the whole generate task on an
fconv checkpoint; here the profiler around a search of a tiny LightConv model)."""

from __future__ import annotations

import time

import pytest
import torch

from convseq.inference.profiler import GenerationProfiler
from convseq.modules.multihead_attention import MultiheadAttention
from convseq.search import beam_search
from tests.search.test_lightconv_search import LENGTHS, batch, sharp_lightconv

HOOKED = ("decoder.convolutions", "decoder.attention", "decoder.output")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def profiled_search(model) -> GenerationProfiler:
    src, lengths = batch(LENGTHS)
    prof = GenerationProfiler([model])
    prof.start()
    prof.batch_start()
    with prof.step():
        beam_search(model, src, lengths, beam=3, max_len_b=10, timer=prof.timer)
    prof.batch_end()
    prof.stop()
    return prof


def test_the_lightconv_decoders_parts_are_timed_inside_its_phase():
    model = sharp_lightconv("dynamic")
    prof = profiled_search(model)
    parts = prof.parts()
    for key in HOOKED:
        assert 0 < parts[key] < prof.wall, key
    assert sum(parts[k] for k in HOOKED) < parts["decoder"]  # hooks inside the decoder phase
    assert 0 <= parts["decoder.layers"] < parts["decoder"]
    labels = [label for label, _, sub in prof.rows() if sub]
    assert "output projection" in labels and "convolutions" in labels
    assert not any("fc2" in label for label in labels)  # fconv's names are not LightConv's
    assert prof.hooks._handles == []  # stop() removed the hooks


def test_a_slowed_attention_is_the_largest_lightconv_decoder_part(monkeypatch):
    model = sharp_lightconv("lightweight")
    forward, calls, delay = MultiheadAttention.forward, [], 0.004

    def slow(self, *args, **kwargs):
        calls.append(1)
        time.sleep(delay)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(MultiheadAttention, "forward", slow)
    parts = profiled_search(model).parts()
    added = len(calls) * delay
    assert calls and parts["decoder.attention"] >= added
    decoder_parts = {k: v for k, v in parts.items() if k.startswith("decoder.")}
    assert max(decoder_parts, key=decoder_parts.get) == "decoder.attention", decoder_parts
