"""The time-to-quality study's driver commands and readings table, on hand-made run folders."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from studies.time_to_quality import driver
from studies.time_to_quality.arms import ARMS, BASE
from studies.time_to_quality.readings import best_by, first_minutes, table


def _run(root: Path, name: str, overrides: list[str], validations: list[dict]) -> None:
    folder = root / name
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    summary = {"epochs": len(validations), "seconds_per_epoch": 30.0, "validations": validations}
    (folder / "summary.json").write_text(json.dumps(summary))


def test_the_table_reads_each_arms_own_overrides_and_its_minutes(tmp_path):
    validations = [
        {"minutes": 5.0, "valid/bleu": 36.0},
        {"minutes": 6.5, "valid/bleu": 38.2},
        {"minutes": 8.0, "valid/bleu": 37.0},
        {"minutes": 15.0, "valid/bleu": 39.5},
    ]
    _run(tmp_path, "a", [*BASE, "optim=adam", "hydra.run.dir=x", "resume=true"], validations)
    (tmp_path / "unfinished").mkdir()  # no summary.json: not a row
    lines = table(tmp_path).splitlines()
    assert len(lines) == 3
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:5] == ["a", "`optim=adam`", "4", "30.0", "39.50 at 15.0"]
    assert cells[5:10] == ["5.0", "5.0", "6.5", "-", "-"]  # 30 35 37.9 40 41
    assert cells[10:] == ["38.20", "39.50"]  # the best by 12 and by 20 minutes
    assert first_minutes(validations, 37.9) == 6.5 and first_minutes([], 1.0) is None
    assert best_by(validations, 4.0) is None and best_by(validations, 8.0) == 38.2


def test_an_arm_resumes_where_it_has_a_last_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "RUNS", tmp_path)
    name = next(iter(ARMS))
    fresh = driver.command(name, ARMS[name])
    assert fresh[:2] == [sys.executable, "run.py"] and "resume=true" not in fresh
    assert f"hydra.run.dir={tmp_path / name}" in fresh
    (tmp_path / name / "checkpoints").mkdir(parents=True)
    (tmp_path / name / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert driver.command(name, ARMS[name])[-1] == "resume=true"


def test_the_test_curve_steps_at_each_new_best_and_the_table_spreads_seeds(tmp_path):
    from studies.time_to_quality.curve import CURVE_FILE, best_so_far, bleu_at, minutes_to
    from studies.time_to_quality.curve import table as curve_table

    validations = [
        {"epoch": 1, "minutes": 1.0, "valid/bleu": 10.0},
        {"epoch": 2, "minutes": 2.0, "valid/bleu": 30.0},
        {"epoch": 3, "minutes": 3.0, "valid/bleu": 29.0},  # not better: the user keeps epoch 2
        {"epoch": 4, "minutes": 4.0, "valid/bleu": 38.5},
    ]
    steps = best_so_far(validations)
    assert [s["epoch"] for s in steps] == [1, 2, 4]
    for s, test in zip(steps, (9.0, 31.0, 38.0)):
        s["test_bleu"] = test
    assert minutes_to(steps, 37.9) == 4.0 and minutes_to(steps, 39.0) is None
    assert bleu_at(steps, 3.5) == 31.0 and bleu_at(steps, 0.5) is None
    runs = []
    for seed, shift in ((1, 0.0), (2, 2.0)):
        run = tmp_path / f"seed{seed}"
        run.mkdir()
        moved = [{**s, "minutes": s["minutes"] + shift} for s in steps]
        (run / CURVE_FILE).write_text(json.dumps(moved))
        runs.append(run)
    cells = [c.strip() for c in curve_table(runs).splitlines()[2].strip("|").split("|")]
    assert cells[0] == "5.00 (4.00-6.00)"  # minutes to 37.9: 4 and 6
    assert cells[1] == "-"  # 39: never
    assert cells[5] == "38.00 (38.00-38.00)"  # test BLEU at 8 minutes: 38.0 in both


def test_a_recipe_arm_runs_its_own_experiment_without_the_exploration_base(tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "RUNS", tmp_path)
    cmd = driver.command("fast_seed2", ARMS["fast_seed2"])
    assert "experiment=multi30k_fast" in cmd and "seed=2" in cmd
    # not the exploration's study base nor its blindness to test: the recipe's own final test
    assert "experiment=multi30k_study" not in cmd and "final_test=false" not in cmd
    explore = driver.command("adam5e-3_cos1600", ARMS["adam5e-3_cos1600"])
    assert explore[2 : 2 + len(BASE)] == BASE


def test_the_figure_is_a_png_of_every_runs_steps(tmp_path):
    from studies.time_to_quality.curve import CURVE_FILE, plot

    run = tmp_path / "seed1"
    run.mkdir()
    steps = [{"minutes": 1.0, "test_bleu": 20.0}, {"minutes": 5.0, "test_bleu": 38.5}]
    (run / CURVE_FILE).write_text(json.dumps(steps))
    png = plot({"fast": [run]}, tmp_path / "ttq.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_averaging_reads_whole_windows_of_kept_epochs_against_the_best_so_far(
    tmp_path, monkeypatch
):
    from studies.time_to_quality import averaging

    assert averaging.window({3, 4, 5}, 5, 3) == [5, 4, 3]
    assert averaging.window({3, 5}, 5, 3) is None  # epoch 4 was not kept
    assert averaging.window({1, 2}, 2, 3) is None  # no epoch 0
    bleus = {1: 10.0, 2: 30.0, 3: 29.0, 4: 31.0}
    assert averaging.best_n(bleus, {1, 2, 3, 4}, 4, 2) == [4, 2]
    assert averaging.best_n(bleus, {1, 2, 3}, 4, 2) == [2, 3]  # epoch 4 was not kept
    assert averaging.best_n(bleus, {1, 2, 3, 4}, 1, 2) is None
    assert averaging.epochs_to_read(9, 3, 2) == [4, 6, 8, 9]
    assert averaging.epochs_to_read(8, 3, 2) == [4, 6, 8]

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for e in range(1, 7):
        (run / "checkpoints" / f"epoch{e:03d}.ckpt").write_bytes(b"")
    bleus = [10.0, 30.0, 35.0, 38.0, 37.0, 36.5]  # the best so far stays at epoch 4's 38.0
    validations = [
        {"epoch": e, "minutes": float(e), "valid/bleu": b} for e, b in enumerate(bleus, 1)
    ]
    (run / "summary.json").write_text(json.dumps({"validations": validations}))
    averaged = []
    monkeypatch.setattr(
        averaging, "averaged_bleu", lambda r, epochs: averaged.append(epochs) or 38.5
    )
    read = averaging.rows(run, [3, 5], 2)
    assert averaged == [
        [4, 3, 2],  # epoch 4: the last 3, the best 3 (the same), no 5 before it
        [4, 3, 2],
        [6, 5, 4],  # epoch 6: the last 3, then the best 3 so far
        [4, 5, 6],
        [6, 5, 4, 3, 2],
        [4, 5, 6, 3, 2],
    ]
    assert [(r["epoch"], r["best"], r["own"]) for r in read] == [(4, 38.0, 38.0), (6, 38.0, 36.5)]
    assert read[0]["last5"] is None and read[0]["best5"] is None
    last = averaging.table(read, [3, 5]).splitlines()[-1]
    assert last == "| 6 | 6.0 | 36.50 | 38.00 |" + " 38.50 (+0.50) |" * 4


def test_a_kept_translation_is_read_back_and_a_missing_checkpoint_is_named(tmp_path):
    import pytest

    from studies.time_to_quality.scoring import bleu

    out = tmp_path / "done"
    out.mkdir()
    (out / "generate-valid.json").write_text(json.dumps({"scores": {"bleu": 41.25}}))
    assert bleu(tmp_path / "gone.ckpt", out, "valid") == 41.25  # not translated again
    with pytest.raises(SystemExit, match="gone.ckpt: missing"):
        bleu(tmp_path / "gone.ckpt", tmp_path / "new", "valid")


def test_two_recipes_get_a_table_each_and_one_figure(tmp_path, monkeypatch, capsys):
    import pytest

    from studies.time_to_quality import curve

    runs = {}
    for name, bleu in (("fast1", 38.0), ("fast2", 39.0), ("fconv1", 30.0)):
        run = tmp_path / name
        run.mkdir()
        (run / curve.CURVE_FILE).write_text(json.dumps([{"minutes": 4.0, "test_bleu": bleu}]))
        runs[name] = str(run)
    (tmp_path / "fast1" / ".hydra").mkdir()
    overrides = "- +experiment=multi30k_fast\n- seed=1\n"  # the legend's default label
    (tmp_path / "fast1" / ".hydra" / "overrides.yaml").write_text(overrides)
    png = tmp_path / "both.png"
    argv = ["curve", "--table", runs["fast1"], runs["fast2"], "--group", "fconv", runs["fconv1"]]
    monkeypatch.setattr(sys, "argv", [*argv, "--plot", str(png), "--cpu", "Test CPU"])
    curve.main()
    out = capsys.readouterr().out
    fast, fconv = out.split("fconv:\n")
    assert "4.00 (4.00-4.00)" in fast.split("multi30k_fast:\n")[1]  # both seeds reach 37.9 at 4
    assert "2 runs" in fast and "| - |" in fconv and "1 runs" in fconv  # 30.0: never 37.9
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setattr(sys, "argv", ["curve", "--table", runs["fast1"], "--group", "fconv"])
    with pytest.raises(SystemExit):
        curve.main()
    assert "--group fconv: give the label, then at least one run folder" in capsys.readouterr().err


def test_a_runs_end_is_its_last_validation_or_its_last_kept_epochs_record(tmp_path):
    import torch

    from studies.time_to_quality.curve import run_end

    assert run_end(tmp_path) is None  # nothing recorded
    validations = [{"epoch": 1, "minutes": 1.5}, {"epoch": 2, "minutes": 2.5}]
    (tmp_path / "summary.json").write_text(json.dumps({"validations": validations}))
    (tmp_path / "checkpoints").mkdir()
    assert run_end(tmp_path) == 2.5
    later = {"convseq": {"validations": [*validations, {"epoch": 3, "minutes": 3.75}]}}
    torch.save(later, tmp_path / "checkpoints" / "epoch003.ckpt")
    assert run_end(tmp_path) == 3.75  # a summary that stopped at the best epoch


def test_a_continuing_arm_starts_as_its_sources_copy_and_resumes(tmp_path, monkeypatch):
    import pytest

    from studies.time_to_quality.arms import CONTINUES

    monkeypatch.setattr(driver, "RUNS", tmp_path)
    name, source = next(iter(CONTINUES.items()))
    with pytest.raises(SystemExit, match=f"run {source} first"):
        driver.start_from(name)
    (tmp_path / source / "checkpoints").mkdir(parents=True)
    (tmp_path / source / "checkpoints" / "last.ckpt").write_bytes(b"x")
    (tmp_path / source / "test_curve" / "epoch001").mkdir(parents=True)
    for done in ("summary.json", "test_curve.json"):
        (tmp_path / source / done).write_text("{}")
    driver.start_from(name)
    copy = tmp_path / name
    assert (copy / "checkpoints" / "last.ckpt").read_bytes() == b"x"
    assert (copy / "test_curve" / "epoch001").is_dir()  # the shared epochs' translations
    assert not (copy / "summary.json").exists() and not (copy / "test_curve.json").exists()
    assert driver.command(name, ARMS[name])[-1] == "resume=true"
    (copy / "checkpoints" / "last.ckpt").write_bytes(b"y")
    driver.start_from(name)  # a folder of its own is left as it is
    assert (copy / "checkpoints" / "last.ckpt").read_bytes() == b"y"


def test_targets_goals_and_the_direction_are_the_runs_own(tmp_path, monkeypatch, capsys):
    import pytest

    from studies.time_to_quality import curve

    run = tmp_path / "ende1"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("data:\n  src_lang: en\n  tgt_lang: de\n")
    steps = [{"minutes": 3.0, "test_bleu": 35.0}, {"minutes": 9.0, "test_bleu": 37.5}]
    (run / curve.CURVE_FILE).write_text(json.dumps(steps))
    assert curve.direction(run) == "en-de" and curve.direction(tmp_path) == "de-en"
    argv = ["curve", "--table", str(run), "--targets", "35.65,37.15", "--goals", "45:37.15"]
    monkeypatch.setattr(sys, "argv", [*argv, "--plot", str(tmp_path / "ende.png")])
    curve.main()
    out = capsys.readouterr().out
    assert out.startswith("ende1:\n")  # no experiment= override: the folder names the runs
    head, _, cells = out.splitlines()[1:4]
    assert head.startswith("| min to test 35.65 | min to test 37.15 | test BLEU at 8 min")
    assert cells.startswith("| 9.00 | 9.00 | 35.00 |")  # 35.0 < 35.65: first at 37.5
    monkeypatch.setattr(sys, "argv", ["curve", "--table", str(run), "--goals", "45-37.15"])
    with pytest.raises(SystemExit):
        curve.main()
    assert "'45-37.15': give MINUTES:BLEU pairs" in capsys.readouterr().err
