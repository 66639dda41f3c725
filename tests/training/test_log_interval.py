"""The logging interval is clamped to an epoch's updates: no Lightning warning on a small corpus,
and the per-update figures reach metrics.csv in every epoch."""

from __future__ import annotations

import warnings

import pytest
import torch

from convseq.evaluation.history import read_metrics
from convseq.tasks.train import train
from convseq.training.log_interval import updates_per_epoch
from tests.training_utils import tiny_config

WARNING = "smaller than the logging interval"


def _train_recording_warnings(cfg) -> list[str]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train(cfg)
    finally:
        torch.set_num_threads(before)
    return [str(w.message) for w in caught]


def _train_rows(out) -> dict[int, list[int]]:
    """Epoch (0-based) -> the steps of the rows holding per-update train/loss."""
    rows: dict[int, list[int]] = {}
    for row in read_metrics(out / "csv" / "metrics.csv"):
        if row.get("train/loss") is not None:
            rows.setdefault(int(row["epoch"]), []).append(int(row["step"]))
    return rows


@pytest.mark.parametrize(("accumulate", "updates"), [(1, 18), (2, 9)])
def test_fewer_updates_than_log_every_n_steps_log_once_an_epoch_without_a_warning(
    tiny_data, tmp_path, caplog, accumulate, updates
):
    # the tiny corpus: 18 batches an epoch, far fewer than the default interval of 50
    cfg = tiny_config(
        tiny_data,
        tmp_path,
        "trainer.log_every_n_steps=50",
        f"trainer.accumulate_grad_batches={accumulate}",
        "trainer.max_epochs=2",
    )
    messages = _train_recording_warnings(cfg)
    assert not [m for m in messages if WARNING in m]
    # Lightning's step column counts updates from 0: the last update of each epoch is logged
    assert _train_rows(tmp_path) == {0: [updates - 1], 1: [2 * updates - 1]}
    note = (
        f"convseq: an epoch has {updates} updates, fewer than trainer.log_every_n_steps=50: "
        f"per-update figures are logged every {updates} updates"
    )
    assert [r.getMessage() for r in caplog.records].count(note) == 1


def test_an_interval_shorter_than_the_epoch_is_kept(tiny_data, tmp_path, caplog):
    cfg = tiny_config(tiny_data, tmp_path, "trainer.log_every_n_steps=5", "trainer.max_epochs=1")
    messages = _train_recording_warnings(cfg)
    assert not [m for m in messages if WARNING in m]
    assert _train_rows(tmp_path) == {0: [4, 9, 14]}
    assert not [r for r in caplog.records if "log_every_n_steps" in r.getMessage()]


def test_updates_per_epoch_counts_a_partial_last_update():
    assert updates_per_epoch(18, 1) == 18
    assert updates_per_epoch(18, 4) == 5
    assert updates_per_epoch(3, 8) == 1
