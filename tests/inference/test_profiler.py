"""`gen.profile=true`: each part of a generate run is measured where it happens.

The parts that are measured (not remainders) must each be positive and below the wall time, and
a part made slow on purpose must come out as the largest, by at least the time added.
"""

from __future__ import annotations

import time

import pytest

from convseq.inference.profiler import TOP_PARTS
from convseq.modules.attention import AttentionLayer
from convseq.tasks.generate import run_generate
from tests.generation_utils import generate_config, tiny_checkpoint

MEASURED = (
    "data",
    "encoder",
    "decoder",
    "candidates",
    "selection",
    "finalisation",
    "reorder",
    "detok",
    "scoring",
    "decoder.convolutions",
    "decoder.attention",
    "decoder.output",
)
REMAINDERS = ("glue", "decoder.layers", "decoder.log_softmax")  # what the others leave


@pytest.fixture
def tiny_ckpt(tiny_data, tmp_path_factory):
    return tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())


def profile(tiny_data, tiny_ckpt, out) -> dict:
    result = run_generate(generate_config(tiny_data, out, f"ckpt={tiny_ckpt}", "gen.profile=true"))
    return result["profile"]


def test_every_measured_part_is_positive_and_below_the_wall_time(
    tiny_data, tiny_ckpt, tmp_path, capsys, one_thread
):
    prof = profile(tiny_data, tiny_ckpt, tmp_path)
    parts, wall = prof["parts_seconds"], prof["wall_seconds"]
    for key in MEASURED:
        assert 0 < parts[key] < wall, key
    for key in REMAINDERS:
        assert 0 <= parts[key] < wall, key
    sub = sum(parts[k] for k in ("decoder.convolutions", "decoder.attention", "decoder.output"))
    assert sub < parts["decoder"]  # hooks inside the decoder's phase, never more than it
    assert prof["sum_of_parts"] < wall
    printed = capsys.readouterr().out
    assert "Where the time goes (generate)" in printed and "  convolutions" in printed


def test_a_slowed_attention_is_the_largest_decoder_part_by_the_time_added(
    tiny_data, tiny_ckpt, tmp_path, monkeypatch, one_thread
):
    delay, calls = 0.004, []
    forward = AttentionLayer.forward

    def slow(self, *args, **kwargs):
        calls.append(None)
        time.sleep(delay)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(AttentionLayer, "forward", slow)
    prof = profile(tiny_data, tiny_ckpt, tmp_path)
    parts = prof["parts_seconds"]
    added = len(calls) * delay
    assert calls and parts["decoder.attention"] >= added
    decoder_parts = {k: v for k, v in parts.items() if k.startswith("decoder.")}
    assert max(decoder_parts, key=decoder_parts.get) == "decoder.attention", decoder_parts
    top = {k: parts[k] for k in TOP_PARTS}
    assert max(top, key=top.get) == "decoder", top
    assert parts["decoder"] >= added and parts["encoder"] < added  # charged where it happened
