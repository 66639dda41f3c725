"""Experiment trackers (`logger=...`) and extra callbacks (`callbacks=...`), read back.

Each tracker's figures are read with its own reader (tracker_readers.py) and must equal
csv/metrics.csv's at the same steps; a resumed run's series must equal an uninterrupted run's.
docs/trackers.md's MLflow read-back command runs, as the page gives it, on the MLflow run here.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from convseq.evaluation.history import read_metrics
from convseq.training.trackers import TrackerError, build_loggers, config_callbacks
from tests.training import tracker_readers as read
from tests.training.test_resume import SendSignal
from tests.training_utils import last_checkpoint, summary, tiny_config, train_one_thread

EPOCHS = "trainer.max_epochs=3"  # 18 updates an epoch
TRACKERS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "trackers.md"


def _straight_and_cut(tiny_data, tmp_path, *overrides: str):
    """An uninterrupted 3-epoch run, and one cut by SIGTERM at update 25 then resumed."""
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    train_one_thread(tiny_config(tiny_data, straight, EPOCHS, *overrides))
    train_one_thread(
        tiny_config(tiny_data, cut, EPOCHS, *overrides), [SendSignal(signal.SIGTERM, 25)]
    )
    assert summary(cut)["signal"] == "SIGTERM"
    train_one_thread(tiny_config(tiny_data, cut, EPOCHS, "resume=true", *overrides))
    assert summary(cut)["epochs"] == 3
    return straight, cut


def _test_scores(series: Counter) -> Counter:
    """The part of a series that is the test BLEU/chrF (trackers only, not metrics.csv)."""
    return Counter({k: n for k, n in series.items() if k[1] in ("test/bleu", "test/chrf")})


def _assert_test_scores(series, run) -> None:
    """The test BLEU/chrF in summary.json reach the tracker at the test's step."""
    test = summary(run)["test"]
    step = next(
        int(r["step"]) for r in read_metrics(run / "csv" / "metrics.csv") if "test/loss" in r
    )
    assert series[read._key(step, "test/bleu", test["test/bleu"])] == 1
    assert series[read._key(step, "test/chrf", test["test/chrf"])] == 1


def test_tensorboard_figures_hparams_and_resume_without_duplicates(tiny_data, tmp_path):
    pytest.importorskip("tensorboard")
    straight, again = tmp_path / "straight", tmp_path / "again"
    tb = ("logger=tensorboard", "checkpoint.keep_epochs=-1")
    train_one_thread(tiny_config(tiny_data, straight, EPOCHS, *tb))
    series = read.tensorboard_series(straight)
    csv = read.csv_series(straight)
    # every figure of metrics.csv at its step, once; and the test scores besides
    assert csv and series - csv == _test_scores(series) and not csv - series
    assert {name for _, name, _ in csv} >= {"train/loss", "train/gnorm", "train/lr", "valid/loss"}
    _assert_test_scores(series, straight)
    hp = read.tensorboard_hparams(straight)
    assert hp["optim.lr"] == 0.25 and hp["run_dir"] == str(straight)
    assert hp["model.encoder_layers"] == "[[16, 3]]"

    # a process that logged a whole epoch after epoch002.ckpt (then died): resumed from that
    # checkpoint, TensorBoard's reader drops the epoch logged twice
    train_one_thread(tiny_config(tiny_data, again, EPOCHS, *tb))
    ckpt = again / "checkpoints" / "epoch002.ckpt"
    train_one_thread(tiny_config(tiny_data, again, EPOCHS, *tb, f"resume={ckpt}"))
    assert read.tensorboard_series(again) == series


def test_mlflow_file_store_figures_params_and_resume_same_run(tiny_data, tmp_path):
    mlflow = pytest.importorskip("mlflow")
    straight, cut = _straight_and_cut(tiny_data, tmp_path, "logger=mlflow")
    ids = {}
    for run in (straight, cut):
        ids[run] = last_checkpoint(run)["callbacks"]["TrackerRunIds"]["MLFlowLogger"]
        client = mlflow.tracking.MlflowClient(str(run / "mlruns"))
        series = read.mlflow_series(client, ids[run])
        assert series - _test_scores(series) == read.csv_series(run)
        _assert_test_scores(series, run)
        found = client.get_run(ids[run])
        assert found.data.params["optim.lr"] == "0.25"
        assert found.data.tags["run_dir"] == str(run)
        # the resumed run continued the first one: one run in the store
        experiment = client.get_experiment_by_name("convseq")
        assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [ids[run]]
    assert read.mlflow_series(
        mlflow.tracking.MlflowClient(str(cut / "mlruns")), ids[cut]
    ) == read.mlflow_series(mlflow.tracking.MlflowClient(str(straight / "mlruns")), ids[straight])
    # docs/trackers.md's read-back command, as the page gives it, prints the valid/loss series
    rows = read_metrics(straight / "csv" / "metrics.csv")
    expected = [(int(r["step"]), r["valid/loss"]) for r in rows if "valid/loss" in r]
    assert len(expected) == 3  # one validation an epoch
    got = _page_read_back(straight)
    assert [step for step, _ in got] == [step for step, _ in expected]
    assert [value for _, value in got] == pytest.approx([loss for _, loss in expected], rel=1e-6)


def _page_read_back(run: Path) -> list[tuple[int, float]]:
    """Run docs/trackers.md's MLflow read-back block for `run` in bash, in an environment
    without MLFLOW_ALLOW_FILE_STORE (this process has it from training: the page's command must
    set it itself); its output lines, as (step, value)."""
    text = TRACKERS_PAGE.read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "MlflowClient" in b]
    assert len(blocks) == 1, "docs/trackers.md: one bash block reads an MLflow run back"
    command, n = re.subn(r"(?m)^RUN=\S+", lambda _: f"RUN={shlex.quote(str(run))}", blocks[0])
    assert n == 1, "the block sets RUN=<run folder> on a line of its own"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_ALLOW_FILE_STORE"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(
        ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [(int(step), float(value)) for step, value in map(str.split, done.stdout.splitlines())]


def test_the_pages_mlflow_ui_line_sets_the_file_store_variable():
    """`mlflow ui` on a folder store needs MLFLOW_ALLOW_FILE_STORE too (the full package: the
    skinny one the extra installs has no UI), so docs/trackers.md's line sets it."""
    text = TRACKERS_PAGE.read_text(encoding="utf-8")
    ui = [line for line in text.splitlines() if "mlflow ui --backend-store-uri" in line]
    assert ui and all(line.startswith("MLFLOW_ALLOW_FILE_STORE=true mlflow ui") for line in ui)
    assert "pip install mlflow\n" in text  # the package the UI needs, named on the page


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
    """W&B offline and quiet, its caches under tmp_path: nothing leaves the machine."""
    pytest.importorskip("wandb")
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_CACHE_DIR": str(tmp_path / "wandb_cache"),
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb_config"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb_data"),
    }.items():
        monkeypatch.setenv(name, value)


def test_wandb_offline_figures_config_and_resume_same_run(tiny_data, tmp_path, wandb_offline):
    straight, cut = _straight_and_cut(tiny_data, tmp_path, "logger=wandb")
    for run in (straight, cut):
        series = read.wandb_series(run)
        assert series - _test_scores(series) == read.csv_series(run)
        _assert_test_scores(series, run)
        config = read.wandb_config(run)
        assert config["optim"]["lr"] == 0.25 and config["run_dir"] == str(run)
    assert read.wandb_series(cut) == read.wandb_series(straight)
    # the resumed process continued the W&B run of the same id
    runs = [r.run for kind, r in read.wandb_records(cut) if kind == "run"]
    run_id = last_checkpoint(cut)["callbacks"]["TrackerRunIds"]["WandbLogger"]
    assert [r.run_id for r in runs] == [run_id, run_id]


def test_many_writes_csv_tensorboard_and_mlflow(tiny_data, tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    run = tmp_path / "run"
    train_one_thread(tiny_config(tiny_data, run, "trainer.max_epochs=1", "logger=many"))
    csv = read.csv_series(run)
    assert (run / "mlruns").is_dir() and csv
    assert read.tensorboard_series(run) - csv == _test_scores(read.tensorboard_series(run))


def test_a_missing_tracker_package_fails_at_once_with_the_install_line(
    tiny_data, tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    run = tmp_path / "run"
    with pytest.raises(TrackerError) as e:
        train_one_thread(tiny_config(tiny_data, run, "logger=mlflow"))
    assert "logger: MLFlowLogger needs the 'mlflow' package" in str(e.value)
    assert 'pip install -e ".[loggers]"' in str(e.value)
    assert not (run / "checkpoints" / "last.ckpt").exists()


def test_bad_entries_are_named_by_key(tiny_data, tmp_path):
    cfg = tiny_config(tiny_data, tmp_path, "+callbacks.mine._target_=no.such.Thing")
    with pytest.raises(TrackerError, match=r"callbacks\.mine\._target_: cannot import"):
        config_callbacks(cfg.callbacks)
    cfg = tiny_config(
        tiny_data, tmp_path, "+callbacks.mine._target_=convseq.training.trackers.TrackerError"
    )
    with pytest.raises(TrackerError, match=r"callbacks\.mine: .* is not a Lightning callback"):
        config_callbacks(cfg.callbacks)
    cfg = tiny_config(tiny_data, tmp_path, "logger=many", "logger.csv=3")
    with pytest.raises(TrackerError, match=r"logger\.csv: not a `_target_` entry"):
        build_loggers(cfg.logger, tmp_path)
    # convseq's own CSV logger stays, whatever is chosen (here: none at all)
    cfg = tiny_config(tiny_data, tmp_path, "logger=many", "logger.csv=null")
    cfg = replace(cfg, logger={"csv": None})
    loggers = build_loggers(cfg.logger, tmp_path)
    assert [type(lg).__name__ for lg in loggers] == ["AppendingCSVLogger"]


def test_an_extra_callback_from_config_logs_the_lr(tiny_data, tmp_path):
    run = tmp_path / "run"
    train_one_thread(tiny_config(tiny_data, run, "trainer.max_epochs=2", "callbacks=lr_monitor"))
    rows = read_metrics(run / "csv" / "metrics.csv")
    monitored = {int(r["step"]): r["lr-NAG"] for r in rows if "lr-NAG" in r}
    logged = {int(r["step"]): r["train/lr"] for r in rows if "train/lr" in r}
    assert monitored and set(logged) <= set(monitored)
    assert all(monitored[s] == lr for s, lr in logged.items())


def test_no_tracker_folder_with_the_default_logger(tiny_data, tmp_path):
    run = tmp_path / "run"
    train_one_thread(tiny_config(tiny_data, run, "trainer.max_epochs=1"))
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == ["checkpoints", "csv"]
    assert os.path.isfile(run / "csv" / "metrics.csv")
