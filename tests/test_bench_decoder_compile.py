"""bench/bench_decoder_compile.py's parts: its compiled search model translates exactly as the eager
one, and its timer separates each search's first decoder call from the rest."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_decoder_compile as bdc  # noqa: E402
from machine import machine, machine_line  # noqa: E402
from search_inputs import make_batches, random_model, random_sources  # noqa: E402


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    model = random_model("fconv_iwslt_de_en", 60, 0.5, "cpu")
    batches = make_batches(random_sources(6, (3, 8), 60, seed=2), 3, "cpu")
    return model, batches


def test_timer_counts_one_first_step_per_search(small):
    model, batches = small
    timer = bdc.FirstStepTimer()
    _, hyps = bdc.translate(model, batches, beam=3, timer=timer)
    assert len(hyps) == 6
    # every search decodes at least twice (EOS is forbidden at step 0), so the first steps of
    # the two searches are a strict part of the decoder's time and calls
    assert timer.calls > 2 * len(batches)
    assert 0 < timer.first_step < timer.decoder
    # the first search's first call alone: one fresh flag per search, not one per run
    one = bdc.FirstStepTimer()
    bdc.translate(model, batches[:1], beam=3, timer=one)
    assert one.calls < timer.calls


def test_main_names_the_machine(capsys):
    threads = str(torch.get_num_threads())  # main sets the thread count: keep this process's
    args = ["--random", "--sentences", "4", "--batch", "4", "--beam", "2", "--repeats", "1"]
    result = bdc.main([*args, "--threads", threads, "--skip-compile"])
    assert result["machine"]["model"] == machine()["model"]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == machine_line(result["machine"])
    assert out[1].startswith("step 0's decoder call: ")


@pytest.mark.slow
def test_compiled_decoder_call_gives_the_eager_hypotheses(small):
    model, batches = small
    eager = bdc.translate(model, batches, beam=3)[1]
    fast = bdc.compiled(model)
    assert bdc.translate(fast, batches, beam=3)[1] == eager
    assert bdc.translate(fast, batches, beam=3)[1] == eager  # the cached graphs too
