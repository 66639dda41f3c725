"""`profile=true`: a training epoch's parts are measured where they happen.

The epoch profiler charges each Lightning action's own time to a part and leaves `loop` as what
no action covers. Each measured part must be positive and below the epoch's wall time, and a
training step made slow on purpose must show up as `forward`, the largest part, by at least the
time added (and not without it).
"""

from __future__ import annotations

import time

from convseq.tasks.train import train
from convseq.training.module import ConvSeqModule
from tests.training_utils import summary, tiny_config

MEASURED = ("data", "forward", "backward", "optimiser", "logging", "validation", "checkpointing")


def epoch_parts(tiny_data, out) -> tuple[dict[str, float], float]:
    train(
        tiny_config(tiny_data, out, "trainer.max_epochs=1", "profile=true", "gen.test_bleu=false")
    )
    epoch = summary(out)["profile"]["epochs"][0]
    return {k: v for k, v in epoch.items() if k != "wall"}, epoch["wall"]


def test_every_measured_part_is_positive_and_below_the_epochs_wall_time(
    tiny_data, tmp_path, one_thread
):
    parts, wall = epoch_parts(tiny_data, tmp_path)
    for key in MEASURED:
        assert 0 < parts[key] < wall, key
    assert 0 <= parts["loop"] < wall and 0 <= parts["callbacks"] < wall


def test_a_slowed_training_step_is_the_largest_part_by_the_time_added(
    tiny_data, tmp_path, monkeypatch, one_thread
):
    plain, _ = epoch_parts(tiny_data, tmp_path / "plain")
    delay, calls = 0.03, []
    step = ConvSeqModule.training_step

    def slow(self, batch, batch_idx):
        calls.append(batch_idx)
        time.sleep(delay)
        return step(self, batch, batch_idx)

    monkeypatch.setattr(ConvSeqModule, "training_step", slow)
    parts, wall = epoch_parts(tiny_data, tmp_path / "slow")
    added = len(calls) * delay
    assert len(calls) == 18  # the tiny corpus' batches
    assert parts["forward"] >= added > plain["forward"]
    assert max(parts, key=parts.get) == "forward", parts
    assert parts["backward"] < added and parts["validation"] < added  # charged where it happened
