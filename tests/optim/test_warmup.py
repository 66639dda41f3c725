"""Schedules by update (anneal=inverse_sqrt | cosine): their values, their errors, and the lr
every update of a run gets, resumed or not."""

from __future__ import annotations

import math

import pytest

from convseq.evaluation.history import METRICS_FILE, read_metrics
from convseq.optim.build import OptimConfigError
from convseq.optim.config import AnnealConfig
from convseq.optim.warmup import UpdateSchedule
from tests.training_utils import summary, tiny_config


def test_inverse_sqrt_warms_up_linearly_then_decays_with_the_root():
    s = UpdateSchedule(AnnealConfig(name="inverse_sqrt", warmup_updates=4), lr=1.0)
    assert [s.lr_at(u) for u in (1, 2, 3, 4)] == [0.25, 0.5, 0.75, 1.0]
    assert s.lr_at(16) == 0.5 and s.lr_at(64) == 0.25
    s = UpdateSchedule(
        AnnealConfig(name="inverse_sqrt", warmup_updates=2, warmup_init_lr=0.5), lr=1.0
    )
    assert s.lr_at(1) == 0.75 and s.finished(10**9) is None


def test_cosine_falls_from_the_peak_to_min_lr_and_ends_the_run():
    s = UpdateSchedule(AnnealConfig(name="cosine", total_updates=10, min_lr=0.1), lr=1.1)
    assert s.lr_at(1) == pytest.approx(0.1 + 0.5 * (1 + math.cos(math.pi * 0.1)))
    assert s.lr_at(5) == pytest.approx(0.6)  # half way: the mean of peak and floor
    assert s.lr_at(10) == pytest.approx(0.1) and s.lr_at(11) == pytest.approx(0.1)
    assert s.finished(9) is None and "update 10" in s.finished(10)
    by_max_update = UpdateSchedule(AnnealConfig(name="cosine"), lr=1.0, max_update=7)
    assert by_max_update.total == 7


@pytest.mark.parametrize(
    "cfg, key",
    [
        (AnnealConfig(name="inverse_sqrt", warmup_updates=0), "anneal.warmup_updates"),
        (AnnealConfig(name="cosine", warmup_updates=5, total_updates=5), "anneal.total_updates"),
        (AnnealConfig(name="cosine", total_updates=9, warmup_init_lr=2.0), "anneal.warmup_init_lr"),
    ],
)
def test_bad_settings_are_named(cfg, key):
    with pytest.raises(OptimConfigError, match=key):
        UpdateSchedule(cfg, lr=1.0)


def _lrs(run) -> dict[int, float]:
    """update -> the lr it was made with, from metrics.csv (logged every update)."""
    rows = read_metrics(run / "csv" / METRICS_FILE)
    return {int(r["step"]) + 1: r["train/lr"] for r in rows if "train/lr" in r}


def test_every_update_gets_its_lr_and_a_resumed_run_continues_the_schedule(tiny_data, tmp_path):
    from convseq.tasks.train import train

    common = [
        "optim=adam",
        "optim.lr=0.002",
        "anneal=inverse_sqrt",
        "anneal.warmup_updates=5",
        "anneal.warmup_init_lr=0",
        "trainer.log_every_n_steps=1",
        "final_test=false",
    ]
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    train(tiny_config(tiny_data, straight, "max_update=24", *common))
    train(tiny_config(tiny_data, cut, "max_update=7", *common))
    train(tiny_config(tiny_data, cut, "max_update=24", "resume=true", *common))
    expected = {u: 0.002 * min(u / 5, math.sqrt(5 / u)) for u in range(1, 25)}
    for run in (straight, cut):
        lrs = _lrs(run)
        assert sorted(lrs) == list(range(1, 25)), run
        assert all(lrs[u] == pytest.approx(expected[u], rel=1e-6) for u in lrs), run


def test_a_cosine_run_stops_where_its_schedule_ends(tiny_data, tmp_path):
    from convseq.tasks.train import train

    train(
        tiny_config(
            tiny_data,
            tmp_path,
            "anneal=cosine",
            "anneal.warmup_updates=2",
            "anneal.total_updates=11",
            "trainer.max_epochs=3",
            "trainer.log_every_n_steps=1",
            "final_test=false",
        )
    )
    s = summary(tmp_path)
    assert s["updates"] == 11 and "cosine" in s["stop_reason"]
    assert _lrs(tmp_path)[11] == pytest.approx(0.0, abs=1e-12)


def test_checkpoints_hold_the_next_updates_lr(tiny_data, tmp_path):
    """At an epoch's end the optimiser holds the lr of the next update (not optim.lr), so the
    checkpoint and the validation line show the schedule's value."""
    from convseq.tasks.train import train
    from tests.training_utils import last_checkpoint

    train(
        tiny_config(
            tiny_data,
            tmp_path,
            "optim=adam",
            "optim.lr=0.002",
            "anneal=inverse_sqrt",
            "anneal.warmup_updates=5",
            "anneal.warmup_init_lr=0",
            "trainer.max_epochs=1",
            "final_test=false",
        )
    )
    ckpt = last_checkpoint(tmp_path)
    assert ckpt["global_step"] == 18  # the tiny corpus's one epoch
    lr = ckpt["optimizer_states"][0]["param_groups"][0]["lr"]
    assert lr == pytest.approx(0.002 * math.sqrt(5 / 19), rel=1e-9)


def test_a_cosine_without_an_end_is_refused_before_the_data_is_prepared(tmp_path, monkeypatch):
    from convseq.tasks import train as train_task

    def no_data(*args, **kwargs):
        raise AssertionError("the data-bin was opened before the schedule was checked")

    monkeypatch.setattr(train_task, "open_databin", no_data)
    nowhere = {"corpus": tmp_path / "no-corpus", "cache": tmp_path / "cache"}
    cfg = tiny_config(nowhere, tmp_path / "run", "anneal=cosine", "final_test=false")
    with pytest.raises(OptimConfigError, match="anneal.total_updates"):
        train_task.train(cfg)
