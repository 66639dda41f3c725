"""Honest epoch counts: a run stopped inside an epoch (max_update here) trains part of its last
epoch, and its summary line, summary.json and seconds per epoch say so; whole epochs read
"1 epoch", "2 epochs"."""

from __future__ import annotations

import pytest

from convseq.tasks.train import train
from convseq.training.interruption import EpochsDone, epochs_done
from tests.training_utils import summary, tiny_config


@pytest.mark.parametrize(
    ("done", "text", "trained"),
    [
        (EpochsDone(1, 0, 250), "1 epoch", 1.0),
        (EpochsDone(3), "3 epochs", 3.0),
        (EpochsDone(0, 100, 250), "0 epochs and 100 of 250 updates of epoch 1", 0.4),
        (EpochsDone(1, 37, 250), "1 epoch and 37 of 250 updates of epoch 2", 1.148),
        (EpochsDone(2, 1, None), "2 epochs and 1 update of epoch 3", None),
        (EpochsDone(2, 5, None), "2 epochs and 5 updates of epoch 3", None),
    ],
)
def test_epochs_done_in_words_and_as_a_number(done, text, trained):
    assert done.text() == text
    assert done.trained == (None if trained is None else pytest.approx(trained))


def _at(epoch: int, done: int, mid_epoch: bool, total: int | None = 18) -> dict:
    """`stop_point`'s record."""
    return {
        "epoch": epoch,
        "epoch_updates_done": done,
        "epoch_updates": total,
        "updates": 0,
        "mid_epoch": mid_epoch,
    }


def test_epochs_done_from_where_training_stopped():
    # the end of epoch 2, run to its end
    assert epochs_done(_at(2, 18, False), complete=True) == EpochsDone(2, 0, 18)
    # epoch 2's record after a stop inside it (max_update): 7 of its updates
    assert epochs_done(_at(2, 7, False), complete=False) == EpochsDone(1, 7, 18)
    # a signal's stop inside epoch 3 (not yet in the history) after 4 of its updates
    assert epochs_done(_at(3, 4, True), complete=False) == EpochsDone(2, 4, 18)
    # a signal right at epoch 3's start: 2 whole epochs
    assert epochs_done(_at(3, 0, True), complete=False) == EpochsDone(2, 0, 18)


@pytest.mark.parametrize(
    ("max_update", "line", "completed", "trained"),
    [
        # 18 updates an epoch: 25 are epoch 1 and 7 of epoch 2's
        (25, "convseq: 1 epoch and 7 of 18 updates of epoch 2, 25 updates in ", 1, 1 + 7 / 18),
        # the limit at epoch 1's last update: one whole epoch
        (18, "convseq: 1 epoch, 18 updates in ", 1, 1.0),
    ],
)
def test_a_run_stopped_by_max_update_counts_its_partial_epoch(
    tiny_data, one_thread, tmp_path, capsys, max_update, line, completed, trained
):
    train(
        tiny_config(
            tiny_data,
            tmp_path,
            f"max_update={max_update}",
            "trainer.max_epochs=10",
            "final_test=false",
            "trainer.progress=none",
        )
    )
    s = summary(tmp_path)
    assert (
        s["updates"] == max_update
        and s["stop_reason"] == f"reached max_update={max_update} updates"
    )
    assert s["epochs_completed"] == completed
    assert s["epochs_trained"] == pytest.approx(trained)
    assert s["seconds_per_epoch"] == pytest.approx(s["train_seconds"] / trained)
    # the key readers already read keeps its meaning: Lightning's count of epochs begun
    assert s["epochs"] == len(s["history"]) == (2 if max_update > 18 else 1)
    printed = capsys.readouterr().out
    assert line in printed, printed[-2000:]
