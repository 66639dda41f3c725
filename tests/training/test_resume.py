"""Exact resume: a run stopped and continued ends bit for bit where an uninterrupted one does.

Every run here has dropout 0.2 (so the RNG state matters) and an lr change at the boundary
(force_anneal at epoch 3, or a plateau forced to fire after epoch 2). Compared, run against run:
the per-epoch lr list, every logged loss (per update and per epoch, train and valid), the final
weights and the optimiser's momentum buffers, all exactly (CPU arithmetic is deterministic for
the same operations in the same order; nothing here is allowed to reorder them).
"""

from __future__ import annotations

import os
import signal
from collections import Counter

import pytest
import pytorch_lightning as pl
import torch

from convseq.evaluation.history import read_metrics
from convseq.training.run_log import truncate_metrics
from tests.training_utils import last_checkpoint, summary, tiny_config, train_one_thread

BOUNDARY = {
    "force3": ["anneal=force", "anneal.force_anneal=3"],
    "plateau2": ["anneal=plateau", "anneal.lr_threshold=0.9"],  # nothing counts as better
}
EXPECTED_LR = [0.25, 0.25, 0.025, 0.0025]
COMMON = ["model.dropout=0.2"]
# Columns whose values do not depend on timing.
TIMED = ("wps", "ups", "time")


@pytest.fixture(scope="module")
def straight(tiny_data, tmp_path_factory):
    """Uninterrupted 4-epoch runs, made once per setting and shared by the tests."""
    made: dict[tuple[str, ...], object] = {}

    def get(*overrides: str):
        if overrides not in made:
            out = tmp_path_factory.mktemp("straight")
            train_one_thread(
                tiny_config(tiny_data, out, *COMMON, *overrides, "trainer.max_epochs=4")
            )
            made[overrides] = out
        return made[overrides]

    return get


def _deterministic(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.endswith(TIMED) and k != "updates"}


def _logged(out) -> Counter:
    """Every timing-independent train/valid value in metrics.csv, as (step, column, value)."""
    found = Counter()
    for row in read_metrics(out / "csv" / "metrics.csv"):
        for k, v in row.items():
            if k.startswith(("train", "valid")) and not k.endswith(TIMED):
                found[(row["step"], row["epoch"], k, v)] += 1
    return found


def assert_same_run(a, b) -> None:
    sa, sb = summary(a), summary(b)
    assert [h["train_epoch/lr"] for h in sa["history"]] == [
        h["train_epoch/lr"] for h in sb["history"]
    ]
    assert [_deterministic(h) for h in sa["history"]] == [_deterministic(h) for h in sb["history"]]
    assert sa["updates"] == sb["updates"] and sa["epochs"] == sb["epochs"] == 4
    assert _logged(a) == _logged(b)
    ca, cb = last_checkpoint(a), last_checkpoint(b)
    assert ca["state_dict"].keys() == cb["state_dict"].keys()
    for name, tensor in ca["state_dict"].items():
        assert torch.equal(tensor, cb["state_dict"][name]), name
    oa, ob = ca["optimizer_states"][0], cb["optimizer_states"][0]
    assert [{k: v for k, v in g.items()} for g in oa["param_groups"]] == [
        {k: v for k, v in g.items()} for g in ob["param_groups"]
    ]
    for pid, state in oa["state"].items():
        for key, value in state.items():
            assert torch.equal(value, ob["state"][pid][key]), (pid, key)


@pytest.mark.parametrize("boundary", list(BOUNDARY))
def test_two_epochs_then_resume_equals_four_straight(tiny_data, straight, tmp_path, boundary):
    a = straight(*BOUNDARY[boundary])
    assert [h["train_epoch/lr"] for h in summary(a)["history"]] == pytest.approx(EXPECTED_LR)

    b = tmp_path / "run"
    train_one_thread(
        tiny_config(tiny_data, b, *COMMON, *BOUNDARY[boundary], "trainer.max_epochs=2")
    )
    first = summary(b)
    assert first["epochs"] == 2 and first["stop_reason"] == "reached trainer.max_epochs=2"
    train_one_thread(
        tiny_config(
            tiny_data, b, *COMMON, *BOUNDARY[boundary], "trainer.max_epochs=4", "resume=true"
        )
    )
    assert summary(b)["resumed_from"] == str(b / "checkpoints" / "last.ckpt")
    assert_same_run(a, b)


class SendSignal(pl.Callback):
    """Sends `sig` to this process once, after the first batch that ends at update `at`."""

    def __init__(self, sig: int, at: int):
        self.sig, self.at, self.sent = sig, at, False

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.at and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.sig)


@pytest.mark.parametrize(
    ("sig", "at", "accumulate", "saved_at"),
    [
        (signal.SIGTERM, 25, 1, 26),  # epoch 2 has updates 19-36; saved after the next update
        (signal.SIGINT, 12, 2, 13),  # 9 updates an epoch; waits for the update's 2nd batch
    ],
)
def test_a_signal_mid_epoch_saves_at_the_next_update_and_resumes_there(
    tiny_data, straight, tmp_path, sig, at, accumulate, saved_at
):
    setting = (*BOUNDARY["plateau2"], f"trainer.accumulate_grad_batches={accumulate}")
    a = straight(*setting)
    b = tmp_path / "run"
    handler_before = signal.getsignal(sig)
    train_one_thread(
        tiny_config(tiny_data, b, *COMMON, *setting, "trainer.max_epochs=4"), [SendSignal(sig, at)]
    )

    first = summary(b)
    assert first["interrupted"] and signal.Signals(sig).name in first["stop_reason"]
    assert signal.getsignal(sig) is handler_before  # the process's own handler is back
    ckpt = last_checkpoint(b)
    assert ckpt["global_step"] == saved_at
    position = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    per_epoch = 18 // accumulate
    assert position["epoch"] == 1 and position["offset"] == (saved_at - per_epoch) * accumulate
    assert first["epochs"] == 1 and len(first["history"]) == 1

    train_one_thread(
        tiny_config(tiny_data, b, *COMMON, *setting, "trainer.max_epochs=4", "resume=true")
    )
    assert_same_run(a, b)


def test_a_signal_in_an_epochs_last_update_lets_the_epoch_finish(tiny_data, straight, tmp_path):
    a = straight(*BOUNDARY["plateau2"])
    b = tmp_path / "run"
    cfg = tiny_config(tiny_data, b, *COMMON, *BOUNDARY["plateau2"], "trainer.max_epochs=4")
    train_one_thread(cfg, [SendSignal(signal.SIGTERM, 35)])  # seen at update 36, the end of epoch 2

    first = summary(b)
    assert not first["interrupted"] and first["stop_reason"] == "SIGTERM during epoch 2"
    assert first["epochs"] == 2 and "valid/loss" in first["history"][-1]
    assert last_checkpoint(b)["global_step"] == 36
    train_one_thread(
        tiny_config(
            tiny_data, b, *COMMON, *BOUNDARY["plateau2"], "trainer.max_epochs=4", "resume=true"
        )
    )
    assert_same_run(a, b)


def test_rows_logged_after_the_last_checkpoint_are_dropped_on_resume(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,step,train/loss\n0,4,9.5\n0,9,9.1\n0,14,8.7\n1,19,8.2\n")
    assert truncate_metrics(path, 14) == 1
    assert [r["step"] for r in read_metrics(path)] == [4, 9, 14]
    assert truncate_metrics(path, 14) == 0
