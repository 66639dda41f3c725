"""convseq.evaluation.run_curves over hand-made run folders: the plotted numbers, the figure, the PNG, errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from convseq.errors import DataError
from convseq.evaluation.run_curves import load_history, main, run_curves
from convseq.viz.runs import draw_runs, plot_runs

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

HISTORY = [
    {
        "epoch": 1,
        "updates": 10,
        "train_epoch/lr": 0.25,
        "train_epoch/time": 90.0,
        "valid/loss": 7.5,
        "valid/bleu": 4.5,
    },
    # no BLEU this epoch (bleu_every_n_epochs=2); the valid loss written as null (NaN)
    {
        "epoch": 2,
        "updates": 20,
        "train_epoch/lr": 0.25,
        "train_epoch/time": 150.0,
        "valid/loss": None,
    },
    {
        "epoch": 3,
        "updates": 30,
        "train_epoch/lr": 0.025,
        "train_epoch/time": 120.0,
        "valid/loss": 6.0,
        "valid/bleu": 12.25,
    },
]

# As AppendingCSVLogger writes it: 0-based epochs, step rows, then per epoch a valid row and a
# train_epoch row; a run in progress (epoch 3 started, not finished).
METRICS = (
    "epoch,step,train/loss,train_epoch/lr,train_epoch/time,valid/bleu,valid/loss\n"
    "0,4,9.0,,,,\n"
    "0,9,,,,3.0,8.5\n"
    "0,9,,0.5,60.0,,\n"
    "1,14,8.0,,,,\n"
    "1,19,,,,7.5,7.75\n"
    "1,19,,0.05,30.0,,\n"
    "2,24,7.0,,,,\n"
)


def _summary_run(root: Path, name: str = "finished") -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"epochs": 3, "history": HISTORY}))
    return run


def _csv_run(root: Path, name: str = "running") -> Path:
    run = root / name
    (run / "csv").mkdir(parents=True)
    (run / "csv" / "metrics.csv").write_text(METRICS)
    return run


def test_curves_from_summary_equal_the_history(tmp_path: Path) -> None:
    c = run_curves(_summary_run(tmp_path))
    assert c.source == "summary.json"
    assert c.epoch == [h["epoch"] for h in HISTORY]
    assert c.valid_loss == [7.5, None, 6.0]
    assert c.valid_bleu == [4.5, None, 12.25]
    assert c.lr == [h["train_epoch/lr"] for h in HISTORY]
    assert c.minutes == pytest.approx([1.5, 4.0, 6.0])  # (90, 90+150, 90+150+120) s / 60
    assert c.best_bleu() == (12.25, 3)
    assert c.best_bleu(within_minutes=5.0) == (4.5, 1)
    assert c.best_bleu(within_minutes=1.0)[1] is None


def test_curves_from_metrics_csv_of_a_run_in_progress(tmp_path: Path) -> None:
    c = run_curves(_csv_run(tmp_path), label="r")
    assert (c.label, c.source) == ("r", "csv/metrics.csv")
    assert c.epoch == [1, 2]  # 1-based; epoch 3 has only step rows so far
    assert c.valid_loss == [8.5, 7.75]
    assert c.valid_bleu == [3.0, 7.5]
    assert c.lr == [0.5, 0.05]
    assert c.minutes == pytest.approx([1.0, 1.5])


def test_summary_json_wins_over_metrics_csv(tmp_path: Path) -> None:
    run = _summary_run(tmp_path)
    (run / "csv").mkdir()
    (run / "csv" / "metrics.csv").write_text(METRICS)
    history, source = load_history(run)
    assert source == "summary.json" and history == HISTORY


def test_unknown_epoch_time_leaves_later_minutes_unknown(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    history = [dict(h) for h in HISTORY]
    del history[1]["train_epoch/time"]
    (run / "summary.json").write_text(json.dumps({"history": history}))
    assert run_curves(run).minutes == [1.5, None, None]


def test_figure_lines_hold_the_curves_and_the_mark(tmp_path: Path) -> None:
    a, b = run_curves(_summary_run(tmp_path)), run_curves(_csv_run(tmp_path))
    fig = draw_runs([a, b], mark_minutes=45)
    ax_bleu, ax_loss, ax_lr = fig.axes
    # epochs without a value are left out of the line
    assert list(ax_bleu.lines[0].get_xdata()) == pytest.approx([1.5, 6.0])
    assert list(ax_bleu.lines[0].get_ydata()) == [4.5, 12.25]
    assert list(ax_bleu.lines[1].get_xdata()) == pytest.approx([1.0, 1.5])
    assert list(ax_bleu.lines[1].get_ydata()) == [3.0, 7.5]
    assert list(ax_bleu.lines[2].get_xdata()) == [45, 45]  # the vertical mark
    assert list(ax_loss.lines[0].get_xdata()) == [1, 3]
    assert list(ax_loss.lines[0].get_ydata()) == [7.5, 6.0]
    assert list(ax_loss.lines[1].get_ydata()) == [8.5, 7.75]
    assert list(ax_lr.lines[0].get_ydata()) == [0.25, 0.25, 0.025]
    assert list(ax_lr.lines[1].get_ydata()) == [0.5, 0.05]
    assert ax_lr.get_yscale() == "log"
    assert (
        ax_loss.lines[1].get_color() == ax_bleu.lines[1].get_color() == ax_lr.lines[1].get_color()
    )
    assert [t.get_text() for t in ax_bleu.get_legend().get_texts()] == [a.label, b.label]
    assert len(draw_runs([a]).axes[0].lines) == 1  # no mark unless asked


def test_png_is_written_atomically_and_valid(tmp_path: Path) -> None:
    path = plot_runs([run_curves(_summary_run(tmp_path))], tmp_path / "out" / "c.png", 2.0)
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1500, 440)
    assert [p.name for p in path.parent.iterdir()] == ["c.png"]  # no temporary file left


def test_cli_plots_several_runs_and_prints_the_best_bleu(tmp_path: Path, capsys) -> None:
    a, b = _summary_run(tmp_path), _csv_run(tmp_path)
    out = tmp_path / "curves.png"
    assert main([str(a), str(b), "--out", str(out), "--mark-minutes", "5"]) == 0
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    printed = capsys.readouterr().out
    assert f"{a}: 3 epochs, 6.0 min (from summary.json), best valid BLEU 12.25 (epoch 3)" in printed
    assert "by 5 min 4.50 (epoch 1)" in printed
    assert f"{b}: 2 epochs, 1.5 min (from csv/metrics.csv)" in printed
    assert sorted(p.name for p in a.iterdir()) == ["summary.json"]  # run folders only read


def test_bad_run_folders_are_clear_errors(tmp_path: Path, capsys) -> None:
    with pytest.raises(DataError, match="no such run folder"):
        run_curves(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="neither summary.json nor csv/metrics.csv") as err:
        run_curves(empty)
    assert err.value.path == str(empty)
    (empty / "summary.json").write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON") as err:
        run_curves(empty)
    assert err.value.path == str(empty / "summary.json")
    (empty / "summary.json").write_text(json.dumps({"epochs": 2}))
    with pytest.raises(DataError, match="no 'history' list"):
        run_curves(empty)
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "x.png")]) == 2
    assert "no such run folder" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.slow
def test_a_real_tiny_run(tiny_data, tmp_path: Path) -> None:
    from tests.training_utils import train_one_tiny_epoch

    run = train_one_tiny_epoch(tiny_data, tmp_path / "run")
    history = json.loads((run / "summary.json").read_text())["history"]
    c = run_curves(run)
    assert c.epoch == [1] and c.source == "summary.json"
    assert c.valid_loss == [history[0]["valid/loss"]]
    assert c.lr == [history[0]["train_epoch/lr"]]
    assert c.minutes == pytest.approx([history[0]["train_epoch/time"] / 60])
    # the same run read from its metrics.csv, as while it was still running
    (run / "summary.json").unlink()
    from_csv = run_curves(run)
    assert from_csv.source == "csv/metrics.csv" and from_csv.epoch == [1]
    assert from_csv.valid_loss == pytest.approx(c.valid_loss)
    assert from_csv.minutes == pytest.approx(c.minutes)
