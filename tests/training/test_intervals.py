"""Long epochs: validation, annealing and checkpoints every N updates, and exact resume from them.

The tiny corpus has 18 updates an epoch; validating every 5 updates puts validations inside
epochs (5, 10, 15 in epoch 1; 20, 25, 30, 35 in epoch 2), which is what an epoch of hours needs.
"""

from __future__ import annotations

import csv
import shutil

import pytest
import torch

from convseq.tasks.train import train
from convseq.training.intervals import IntervalError
from tests.training_utils import summary, tiny_config

BY_UPDATES = [
    "trainer.max_epochs=2",
    "validate_interval_updates=5",
    "save_interval_updates=5",
    "trainer.log_every_n_steps=1",
    "anneal=plateau",
    "anneal.lr_patience=0",
    "anneal.lr_shrink=0.5",
    "gen.test_bleu=false",
]


def lr_per_update(out) -> dict[int, float]:
    """train/lr of every update, from csv/metrics.csv (the lr the update was made with)."""
    with open(out / "csv" / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/lr")]
    return {int(r["step"]) + 1: float(r["train/lr"]) for r in rows}


@pytest.fixture(scope="module")
def straight(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("by_updates") / "straight"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(tiny_config(tiny_data, out, *BY_UPDATES))
    finally:
        torch.set_num_threads(before)
    return out


def test_validation_and_annealing_happen_every_n_updates_inside_epochs(straight):
    s = summary(straight)
    v = s["validations"]
    assert [x["updates"] for x in v] == [5, 10, 15, 20, 25, 30, 35]
    assert [x["epoch"] for x in v] == [1, 1, 1, 2, 2, 2, 2]
    # plateau with patience 0: after each validation that is not a new best, the lr halves;
    # the next update is made with it
    lrs, lr, best = lr_per_update(straight), 0.25, float("inf")
    for x in v:
        assert lrs[x["updates"]] == pytest.approx(lr)
        if x["valid/loss"] < best * (1 - 1e-4):
            best = x["valid/loss"]
        else:
            lr *= 0.5
        if x["updates"] + 1 in lrs:
            assert lrs[x["updates"] + 1] == pytest.approx(lr), x["updates"]
    assert s["best_value"] == min(x["valid/loss"] for x in v)
    names = sorted(p.name for p in (straight / "checkpoints").glob("update*.ckpt"))
    assert names == [f"update{u:07d}.ckpt" for u in (5, 10, 15, 20, 25, 30, 35)]


def test_resuming_from_an_update_checkpoint_mid_epoch_ends_as_the_straight_run(
    straight, tiny_data, tmp_path, one_thread
):
    mid = straight / "checkpoints" / "update0000025.ckpt"  # epoch 2, after its 7th update
    out = tmp_path / "resumed"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copy(mid, out / "checkpoints" / "last.ckpt")
    train(tiny_config(tiny_data, out, *BY_UPDATES, "resume=true"))
    a = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 36
    for name, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][name]), name

    # every figure but the wall clock's (`minutes`: the command's time at each validation)
    def figures(run) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "minutes"} for r in summary(run)["validations"]]

    assert figures(out) == figures(straight)


def test_old_update_checkpoints_are_pruned(tiny_data, tmp_path, one_thread):
    cfg = tiny_config(
        tiny_data,
        tmp_path,
        *BY_UPDATES,
        "trainer.max_epochs=1",
        "checkpoint.keep_interval_updates=2",
    )
    train(cfg)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("update*.ckpt"))
    assert names == ["update0000010.ckpt", "update0000015.ckpt"]


def test_a_save_interval_that_is_no_multiple_of_the_validation_interval_is_refused(
    tiny_data, tmp_path
):
    cfg = tiny_config(tiny_data, tmp_path, "validate_interval_updates=4", "save_interval_updates=6")
    with pytest.raises(IntervalError, match="save_interval_updates=6 is not a multiple"):
        train(cfg)
