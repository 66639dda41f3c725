"""The sweep report over hand-made job folders: rows, columns, curves, PNG, errors, task=report."""

from __future__ import annotations

import csv
import json
import math
import struct
from pathlib import Path

import pytest

from convseq.cli.dispatch import dispatch
from convseq.errors import DataError
from convseq.evaluation.report import REPORT_FILES, write_report
from convseq.evaluation.sweep_jobs import find_jobs, load_job, split_overrides
from convseq.viz.curves import plot_curves
from tests.conftest import compose_config

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
COMMON = ["data.generator=null", "trainer.max_epochs=3"]


def _job(root: Path, name: str, overrides: list[str], summary: dict | None = None) -> Path:
    folder = root / name
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def _history(valid: list[float], lrs: list[float], bleu: list[float] | None = None) -> list[dict]:
    out = []
    for i, (v, lr) in enumerate(zip(valid, lrs)):
        h = {"epoch": i + 1, "train_epoch/lr": lr, "valid/loss": v, "train_epoch/time": 2.0}
        if bleu is not None:
            h["valid/bleu"] = bleu[i]
        out.append(h)
    return out


def _summary(history: list[dict], seconds: float, reason: str, test: dict | None = None) -> dict:
    return {
        "epochs": len(history),
        "updates": 10 * len(history),
        "train_seconds": seconds,
        "seconds_per_epoch": seconds / len(history),
        "stop_reason": reason,
        "interrupted": False,
        "history": history,
        "test": test or {},
    }


@pytest.fixture
def sweep(tmp_path) -> Path:
    """Four jobs: two finished, one interrupted with BLEU, one that died (metrics.csv only)."""
    root = tmp_path / "sweep"
    _job(
        root,
        "0",
        [*COMMON, "optim=nag", "anneal=plateau"],
        _summary(
            _history([5.0, 4.0, 4.5], [0.25, 0.25, 0.025]),
            3725.0,
            "lr 2.5e-06 < min_lr",
            {"test/loss": 4.2, "test/ppl": 18.4, "test/bleu": 30.5},
        ),
    )
    _job(
        root,
        "1",
        [*COMMON, "optim=sgd", "anneal=plateau"],
        _summary(
            _history([6.0, 5.5, 5.25], [0.25, 0.25, 0.25]),
            61.0,
            "reached trainer.max_epochs=3",
            {"test/loss": 5.3},
        ),
    )
    interrupted = _summary(_history([7.0, 3.5], [0.5, 0.5], bleu=[10.0, 21.5]), 40.0, "SIGTERM")
    interrupted["interrupted"] = True
    _job(root, "10", [*COMMON, "optim=nag", "anneal=force"], interrupted)
    dead = _job(root, "2", [*COMMON, "optim=adam", "anneal=plateau"])
    (dead / "csv").mkdir()
    (dead / "csv" / "metrics.csv").write_text(
        "epoch,step,train/loss,train_epoch/lr,train_epoch/time,valid/loss\n"
        "0,4,9.0,,,\n"
        "0,9,,,,8.5\n"
        "0,9,,0.001,3.0,\n"
        "1,19,,,,7.75\n"
        "1,19,,0.001,4.0,\n"
    )
    (root / "multirun.yaml").write_text("hydra: {}\n")
    return root


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_jobs_come_in_natural_order_with_their_distinguishing_overrides(sweep):
    assert [p.name for p in find_jobs(sweep)] == ["0", "1", "2", "10"]
    from convseq.evaluation.sweep_jobs import load_job

    jobs = [load_job(p, sweep) for p in find_jobs(sweep)]
    common, varying = split_overrides(jobs)
    assert common == COMMON
    assert varying == [
        ["optim=nag", "anneal=plateau"],
        ["optim=sgd", "anneal=plateau"],
        ["optim=adam", "anneal=plateau"],
        ["optim=nag", "anneal=force"],
    ]


def test_report_rows_hold_time_epochs_stop_reason_and_best_validation(sweep):
    files = write_report(sweep)
    assert set(files) == {"markdown", "csv", "json", "png"}
    assert all(p.parent == sweep for p in files.values())
    rows = _csv_rows(files["csv"])
    assert [r["job"] for r in rows] == ["0", "1", "2", "10"]
    r0, r1, r2, r10 = rows
    assert r0["overrides"] == "optim=nag anneal=plateau"
    assert r0["all_overrides"] == " ".join([*COMMON, "optim=nag", "anneal=plateau"])
    assert (r0["epochs"], float(r0["wall_seconds"]), float(r0["seconds_per_epoch"])) == (
        "3",
        3725.0,
        pytest.approx(3725.0 / 3),
    )
    # Best validation loss is the minimum (epoch 2), not the last epoch's.
    assert (float(r0["best_valid_loss"]), r0["best_valid_epoch"]) == (4.0, "2")
    assert float(r0["last_lr"]) == 0.025 and r0["stop_reason"] == "lr 2.5e-06 < min_lr"
    assert r0["status"] == "ok" and r1["status"] == "ok"
    assert (float(r1["best_valid_loss"]), r1["best_valid_epoch"]) == (5.25, "3")
    # BLEU only where the run computed it; the best is the highest.
    assert r0["best_valid_bleu"] == "" and float(r10["best_valid_bleu"]) == 21.5
    assert r10["status"] == "interrupted" and r10["stop_reason"] == "SIGTERM"
    # The job without summary.json, from its metrics.csv.
    assert r2["status"].startswith("no summary.json")
    assert (r2["epochs"], float(r2["wall_seconds"])) == ("2", 7.0)
    assert (float(r2["best_valid_loss"]), r2["best_valid_epoch"], float(r2["last_lr"])) == (
        7.75,
        "2",
        0.001,
    )
    # Test figures are not shown unless asked (settings are chosen on validation).
    assert not any(k.startswith("test") for k in rows[0])
    md = files["markdown"].read_text()
    assert "test loss" not in md and "test BLEU" not in md


def test_markdown_table_has_one_line_per_job_and_the_plot(sweep):
    md = write_report(sweep)["markdown"].read_text()
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 4  # header + jobs
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header[:6] == ["job", "overrides", "wall time", "epochs", "s/epoch", "stop reason"]
    assert "best valid BLEU (epoch)" in header
    row0 = [c.strip() for c in table[1].strip("|").split("|")]
    assert row0[:4] == ["0", "optim=nag anneal=plateau", "1:02:05", "3"]
    assert "4.0000 (2)" in row0
    assert "`data.generator=null` `trainer.max_epochs=3`" in md
    assert f"]({REPORT_FILES['png']})" in md


def test_test_figures_only_when_asked(sweep):
    files = write_report(sweep, test=True)
    rows = _csv_rows(files["csv"])
    assert float(rows[0]["test_loss"]) == 4.2 and float(rows[0]["test_bleu"]) == 30.5
    assert float(rows[1]["test_loss"]) == 5.3 and rows[1]["test_bleu"] == ""
    assert rows[2]["test_loss"] == ""  # no summary: no test figures
    assert "test BLEU" in files["markdown"].read_text()


def test_curves_json_holds_the_plotted_numbers_and_the_png_is_valid(sweep):
    files = write_report(sweep)
    record = json.loads(files["json"].read_text())
    curves = {c["job"]: c for c in record["curves"]}
    assert curves["0"]["epoch"] == [1, 2, 3]
    assert curves["0"]["valid_loss"] == [5.0, 4.0, 4.5]
    assert curves["0"]["lr"] == [0.25, 0.25, 0.025]
    assert curves["2"]["valid_loss"] == [8.5, 7.75] and curves["2"]["lr"] == [0.001, 0.001]
    assert curves["10"]["label"] == "10: optim=nag anneal=force"
    assert [r["job"] for r in record["rows"]] == ["0", "1", "2", "10"]
    assert record["rows"][0]["best_valid_bleu"] is None  # NaN is written as null
    data = files["png"].read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 500 and height > 200


def test_plot_skips_missing_values_and_non_positive_lr(tmp_path):
    curves = [
        {
            "label": "a",
            "epoch": [1, 2, 3],
            "valid_loss": [None, math.nan, 3.0],
            "lr": [0, 0.1, 0.01],
        }
    ]
    path = plot_curves(curves, tmp_path / "sub" / "c.png")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert [p.name for p in path.parent.iterdir()] == ["c.png"]  # no temporary file left


def test_missing_or_empty_sweep_folder_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="no such sweep folder"):
        write_report(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"no job folders .*python run.py -m"):
        write_report(tmp_path / "empty")


def test_task_report_prints_the_table_and_writes_the_files(sweep, tmp_path, capsys):
    cfg = compose_config(
        ["task=report", f"sweep_dir={sweep}", "report.test=true"], output_dir=str(tmp_path / "o")
    )
    files = dispatch(cfg)
    out = capsys.readouterr().out
    assert "| 10 | optim=nag anneal=force |" in out
    assert "test loss" in out and files["csv"] == sweep / REPORT_FILES["csv"]


def test_task_report_without_sweep_dir_exits_2_naming_the_key(tmp_path, capsys):
    cfg = compose_config(["task=report"], output_dir=str(tmp_path))
    with pytest.raises(SystemExit) as e:
        dispatch(cfg)
    assert e.value.code == 2
    assert "sweep_dir=PATH" in capsys.readouterr().err


def test_the_curves_can_be_drawn_by_updates_with_every_validation(tmp_path):
    """Runs that validate every N updates: a point per validation, at its update count."""
    from convseq.viz.curves import draw_curves

    root = tmp_path / "sweep"
    validations = [
        {"epoch": 1, "updates": 500, "lr": 0.25, "valid/loss": 6.0},
        {"epoch": 1, "updates": 1000, "lr": 0.25, "valid/loss": 5.5},
        {"epoch": 2, "updates": 1500, "lr": 0.125, "valid/loss": 5.6},
    ]
    summary = _summary(_history([5.5, 5.6], [0.25, 0.25]), 100.0, "finished")
    _job(
        root,
        "0",
        [*COMMON, "validate_interval_updates=500"],
        {**summary, "validations": validations},
    )
    _job(root, "1", [*COMMON, "optim=sgd"], _summary(_history([7.0], [0.25]), 50.0, "finished"))
    files = write_report(root, x="updates")
    curves = json.loads(files["json"].read_text())["curves"]
    assert curves[0]["validation_updates"] == [500, 1000, 1500]
    assert curves[0]["validation_loss"] == [6.0, 5.5, 5.6]
    assert curves[0]["validation_lr"] == [0.25, 0.25, 0.125]
    # a job without per-update validations falls back to its epochs' (update count unknown here)
    assert curves[1]["validation_loss"] == [7.0] and curves[1]["validation_updates"] == [None]
    fig = draw_curves(curves, x="updates")
    ax_loss, ax_lr = fig.axes[:2]
    assert ax_loss.get_xlabel() == "update" and ax_lr.get_xlabel() == "update"
    assert list(ax_loss.lines[0].get_xdata()) == [500.0, 1000.0, 1500.0]
    assert list(ax_lr.lines[0].get_ydata()) == [0.25, 0.25, 0.125]
    assert list(draw_curves(curves).axes[0].lines[0].get_xdata()) == [1.0, 2.0]  # by epoch
    with pytest.raises(ValueError, match="x='steps'"):
        draw_curves(curves, x="steps")


def test_a_job_cut_by_a_signal_at_an_epochs_end_is_reported_interrupted(tmp_path):
    history = _history([7.0, 3.5], [0.5, 0.5])
    cut = {**_summary(history, 10.0, "SIGTERM"), "signal": "SIGTERM", "exit_status": 75}
    _job(tmp_path, "0", ["optim=nag"], cut)  # not mid-epoch: "interrupted" stays false
    _job(tmp_path, "1", ["optim=sgd"], _summary(history, 10.0, "max_epochs"))
    status = {path.name: load_job(path, tmp_path).status for path in find_jobs(tmp_path)}
    assert status == {"0": "interrupted", "1": "ok"}


def test_time_to_valid_bleu_columns_show_the_three_highest_numbers_reached(tmp_path):
    """Minutes to valid BLEU: from summary.json's key, or from its validations' minutes for a
    run written before the key existed; `-` where a job never got there."""
    root = tmp_path / "sweep"
    fast = _summary(_history([5.0, 4.0], [0.5, 0.5], bleu=[38.5, 41.2]), 600.0, "done")
    fast["minutes_to_valid_bleu"] = {str(n): 4.0 for n in range(1, 39)} | {"39": 9.5, "40": 9.5}
    fast["minutes_to_valid_bleu"]["41"] = 9.5
    slow = _summary(_history([6.0, 5.0], [0.5, 0.5], bleu=[30.0, 39.4]), 900.0, "done")
    slow["validations"] = [
        {"epoch": 1, "minutes": 7.25, "valid/bleu": 30.0},
        {"epoch": 2, "minutes": 14.5, "valid/bleu": 39.4},
    ]
    _job(root, "0", ["data.generator=null", "optim=nag"], fast)
    _job(root, "1", ["data.generator=null", "optim=adam"], slow)
    files = write_report(root, plot=False)
    table = [line for line in files["markdown"].read_text().splitlines() if line.startswith("| ")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table[1:]]
    at = [header.index(f"min to valid BLEU {n}") for n in (39, 40, 41)]
    assert [rows[0][i] for i in at] == ["9.5", "9.5", "9.5"]
    assert [rows[1][i] for i in at] == ["14.5", "-", "-"]
    csv_rows = _csv_rows(files["csv"])
    assert json.loads(csv_rows[1]["minutes_to_valid_bleu"])["30"] == 7.25
    assert json.loads(csv_rows[1]["minutes_to_valid_bleu"])["39"] == 14.5


def test_a_partial_last_epoch_shows_as_a_fraction_of_epochs():
    from pathlib import Path

    from convseq.evaluation.report import job_row
    from convseq.evaluation.sweep_jobs import SweepJob

    def epochs(summary: dict) -> float:
        base = {"train_seconds": 10.0, "seconds_per_epoch": 5.0, "updates": 25, "stop_reason": "x"}
        return job_row(SweepJob("0", Path("0"), [], {**base, **summary}), [])["epochs"]

    # 1 epoch and 7 of 18 updates of epoch 2: summary.json's epochs says 2, epochs_trained 25/18
    assert epochs({"epochs": 2, "epochs_trained": 25 / 18}) == 1.39
    whole = epochs({"epochs": 2, "epochs_trained": 2.0})
    assert whole == 2 and isinstance(whole, int)
    assert epochs({"epochs": 3}) == 3  # a summary from before epochs_trained
