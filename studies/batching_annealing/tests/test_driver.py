"""The study's driver (`python -m studies.batching_annealing.driver`), without training: which
arms are done, interrupted or new, the force arm's start epoch read from its lua arm, and the
commands it would run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from studies.batching_annealing import driver as study


def fake_run(path: Path, lrs: list[float] | None = None, interrupted: bool = False) -> None:
    """A run folder: last.ckpt, and a summary.json with one history row per lr when given."""
    (path / "checkpoints").mkdir(parents=True)
    (path / "checkpoints" / "last.ckpt").write_bytes(b"x")
    if lrs is not None:
        history = [{"epoch": i + 1, "train_epoch/lr": lr} for i, lr in enumerate(lrs)]
        summary = {"history": history, "interrupted": interrupted}
        (path / "summary.json").write_text(json.dumps(summary))


def test_states_and_resume(tmp_path):
    fake_run(tmp_path / "tok_lua_s1", [0.25] * 3)
    fake_run(tmp_path / "sen_lua_s1", [0.25] * 2, interrupted=True)
    fake_run(tmp_path / "tok_plateau_s1")  # killed: a checkpoint, no summary
    assert study.state(tmp_path / "tok_lua_s1") == "done"
    assert study.state(tmp_path / "sen_lua_s1") == "interrupted"
    assert study.state(tmp_path / "tok_plateau_s1") == "interrupted"
    assert study.state(tmp_path / "sen_plateau_s1") == "new"
    cmd = study.command(study.ARMS["tok_plateau_s1"], tmp_path)
    assert cmd[-1] == "resume=true" and "anneal=plateau" in cmd
    fresh = study.command(study.ARMS["sen_plateau_s1"], tmp_path)
    assert "resume=true" not in fresh
    assert f"hydra.run.dir={tmp_path / 'sen_plateau_s1'}" in fresh


def test_force_starts_where_its_lua_arm_first_annealed(tmp_path):
    # epochs 1-7 at 0.25, then the Lua rule shrinks from epoch 8 on
    fake_run(tmp_path / "tok_lua_s1", [0.25] * 7 + [0.025, 0.0025, 0.00025, 2.5e-05])
    assert study.first_annealed_epoch(tmp_path / "tok_lua_s1") == 8
    cmd = study.command(study.ARMS["tok_force_s1"], tmp_path)
    assert "anneal=force" in cmd and "anneal.force_anneal=8" in cmd
    fake_run(tmp_path / "sen_lua_s1", [0.25] * 4)
    with pytest.raises(SystemExit, match="never fell below 0.25"):
        study.first_annealed_epoch(tmp_path / "sen_lua_s1")


def test_arms_cover_the_design():
    arms = study.ARMS
    assert len(arms) == 14 and len(set(arms)) == 14
    # every NAG batching x annealing cell, seed 1
    for batching in ("tok", "sen"):
        for rule in ("plateau", "lua", "force"):
            assert f"{batching}_{rule}_s1" in arms
    # the end points get seeds 2 and 3 and the momentum-free arms
    for name in ("tok_plateau_s2", "tok_plateau_s3", "sen_lua_s2", "sen_lua_s3"):
        assert name in arms
    sgd = study.ARMS["tok_plateau_sgd25_s1"].overrides
    assert "optim.momentum=0" in sgd and "optim.lr=25" in sgd and "anneal.min_lr=0.001" in sgd
    # plain SGD at NAG's lr stops at its own, smaller safety net; lr 25 keeps the study's
    small = study.ARMS["sen_lua_sgd_s1"].overrides
    assert "optim.momentum=0" in small and f"trainer.max_epochs={study.SGD_CAP_EPOCHS}" in small
    assert not any(o.startswith("trainer.max_epochs") for o in sgd)
    # an epoch's work depends on batching and optimiser only: 4 timing groups
    assert len({study.timing_group(a) for a in arms.values()}) == 4


def test_each_queue_runs_every_nag_arm_before_the_momentum_free_ones():
    # the headline difference and its seed spread first; the longest arms (plain SGD) last
    for queue in study.QUEUES:
        momentum_free = ["optim.momentum=0" in arm.overrides for arm in queue]
        first_sgd = momentum_free.index(True)
        assert all(momentum_free[first_sgd:]) and not any(momentum_free[:first_sgd])
        assert queue[-1].name.endswith("_sgd_s1")  # the capped 60-epoch arm is the very last
    seeds = [arm.name for queue in study.QUEUES for arm in queue if arm.name[-3:] in ("_s2", "_s3")]
    assert sorted(seeds) == ["sen_lua_s2", "sen_lua_s3", "tok_plateau_s2", "tok_plateau_s3"]


def test_timing_commands_one_per_group_and_round_with_the_timed_epochs_only(tmp_path, capsys):
    study.measure_timing(tmp_path / "study", epochs=3, dry_run=True, rounds=2)
    cmds = [line.split() for line in capsys.readouterr().out.splitlines() if "run.py" in line]
    assert len(cmds) == 8
    for cmd in cmds:
        # an arm's own limit (plain SGD's 60) would be a second value for the key: Hydra refuses
        assert [a for a in cmd if a.startswith("trainer.max_epochs=")] == ["trainer.max_epochs=3"]
    dirs = [cmd[-1].removeprefix("hydra.run.dir=") for cmd in cmds]
    # the groups in turn each round: round 1 of all four, then round 2 of all four
    assert [Path(d).name for d in dirs] == ["round1"] * 4 + ["round2"] * 4
    assert [Path(d).parent for d in dirs[:4]] == [Path(d).parent for d in dirs[4:]]
    assert len({Path(d).parent for d in dirs}) == 4
    assert not (tmp_path / "study" / "timing.json").exists()


def test_timing_is_the_median_over_every_rounds_epochs(tmp_path, capsys):
    # finished timed runs are read, not run again: fake them, 2 epochs x 3 rounds per group
    study.measure_timing(tmp_path / "study", epochs=2, dry_run=True, rounds=3)
    dirs = [
        Path(line.split()[-1].removeprefix("hydra.run.dir="))
        for line in capsys.readouterr().out.splitlines()
        if "run.py" in line
    ]
    # run i is group i % 4 in round i // 4 + 1; 134 updates at 2 updates/s = 67 s of updates,
    # and a wall of 67 + (group + 1) x round: group g's rest is (g+1) x (1, 1, 2, 2, 3, 3)
    for i, run_dir in enumerate(dirs):
        wall = 67.0 + (i % 4 + 1) * (i // 4 + 1)
        history = [
            {"epoch": e, "updates": 134 * e, "train_epoch/ups": 2.0, "train_epoch/time": wall}
            for e in (1, 2)
        ]
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({"history": history}))
    (tmp_path / "study").mkdir()
    study.measure_timing(tmp_path / "study", epochs=2, dry_run=False, rounds=3)
    timing = json.loads((tmp_path / "study" / "timing.json").read_text())
    assert set(timing) == {"_note", *study.ARMS}
    group_of = {run_dir.parent.name: i for i, run_dir in enumerate(dirs[:4])}
    for name, arm in study.ARMS.items():
        g = group_of["_".join(o.replace("=", "-") for o in study.timing_group(arm))]
        assert timing[name]["train_seconds_per_epoch"] == 67.0
        assert timing[name]["timed_epochs"] == 6
        assert timing[name]["valid_seconds_per_epoch"] == pytest.approx(2.0 * (g + 1))


def test_epoch_seconds_split_wall_time_into_updates_and_the_rest():
    # two epochs of 134 updates: 2 updates/s of update time, walls with validation 80 and 75 s
    history = [
        {"epoch": 1, "updates": 134, "train_epoch/ups": 2.0, "train_epoch/time": 80.0},
        {"epoch": 2, "updates": 268, "train_epoch/ups": 2.5, "train_epoch/time": 60.0},
    ]
    train, valid = study.epoch_seconds(history)
    assert train == [67.0, 53.6]
    assert valid == [13.0, pytest.approx(6.4)]


def test_arm_lock_keeps_a_second_driver_off(tmp_path):
    with study.arm_lock(tmp_path / "tok_lua_s1") as first:
        assert first
        with study.arm_lock(tmp_path / "tok_lua_s1") as second:
            assert not second  # another open of the lock file: refused while the first holds it
        with study.arm_lock(tmp_path / "sen_lua_s1") as other:
            assert other  # locks are per arm
    with study.arm_lock(tmp_path / "tok_lua_s1") as again:
        assert again  # released on exit


def test_run_queue_runs_its_own_arms_then_the_others_and_passes_over_busy_ones(tmp_path):
    order = study.queue_order(2, 2)
    assert [a.name for a in order[: len(study.QUEUES[1])]] == [a.name for a in study.QUEUES[1]]
    assert {a.name for a in order} == set(study.ARMS) and len(order) == 14
    names = {"sen_lua_s1", "sen_force_s1", "sen_plateau_s1", "tok_lua_s1", "tok_force_s1"}
    small = [a for a in order if a.name in names]
    ran: list[str] = []
    commands: dict[str, list[str]] = {}

    def fake_training(cmd, check, cwd):  # a finished run: lr 0.25 for 3 epochs, then shrinking
        run_dir = Path(next(a for a in cmd if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        fake_run(run_dir, [0.25] * 3 + [0.025, 0.0025])
        ran.append(run_dir.name)
        commands[run_dir.name] = cmd

    with study.arm_lock(tmp_path / "tok_lua_s1") as held:  # another driver is running it
        assert held
        sleeps = []

        def sleep(seconds):  # the other driver finishes tok_lua_s1 while this one waits
            sleeps.append(seconds)
            fake_run(tmp_path / "tok_lua_s1", [0.25] * 5 + [0.025])

        study.time.sleep, real_sleep = sleep, study.time.sleep
        try:
            study.run_queue(small, tmp_path, poll_seconds=7, run=fake_training)
        finally:
            study.time.sleep = real_sleep
    # its own queue first (sen_force after its lua arm), tok_lua_s1 passed over while locked,
    # tok_force_s1 run once tok_lua_s1 was done, from tok_lua_s1's first annealed epoch (6)
    assert ran == ["sen_lua_s1", "sen_plateau_s1", "sen_force_s1", "tok_force_s1"]
    assert sleeps == [7]
    assert "anneal.force_anneal=6" in commands["tok_force_s1"]
    assert "anneal.force_anneal=4" in commands["sen_force_s1"]


def test_list_shows_each_arms_epochs_and_lr_from_its_metrics_csv(tmp_path, monkeypatch, capsys):
    # Lightning's CSV: step rows without the epoch's figures, and one row per finished epoch
    # (0-based) that carries train_epoch/lr
    run = tmp_path / "tok_lua_s1"
    (run / "csv").mkdir(parents=True)
    (run / "csv" / "metrics.csv").write_text(
        "epoch,step,train/loss,train_epoch/lr,valid/bleu\n"
        "0,50,5.1,,\n"
        "0,133,,0.25,3.2\n"
        "1,200,4.0,,\n"
        "1,267,,0.025,9.9\n"
        "2,300,3.9,,\n"  # an epoch in progress: not counted
    )
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert study.progress(run) == "2 epochs, lr 0.025"
    assert study.progress(tmp_path / "sen_lua_s1") == ""  # not started
    monkeypatch.setattr(sys, "argv", ["driver.py", "--root", str(tmp_path), "--list"])
    study.main()
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert len(lines) == len(study.ARMS)
    assert "interrupted" in lines["tok_lua_s1"] and "2 epochs, lr 0.025" in lines["tok_lua_s1"]
    assert lines["sen_lua_s1"].split()[1] == "new" and "epochs" not in lines["sen_lua_s1"]
    with study.arm_lock(run) as mine:  # a driver on it: "running", not "interrupted"
        assert mine and study.is_running(run)
        study.main()
        listed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
        assert listed["tok_lua_s1"].split()[1] == "running"
    assert not study.is_running(run) and not study.is_running(tmp_path / "sen_lua_s1")
