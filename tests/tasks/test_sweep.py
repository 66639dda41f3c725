"""`python run.py -m ...`: a real two-job multirun ends with its report; DDP and SLURM settings."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from omegaconf import open_dict

from convseq.cli.hydra_callbacks import SweepReport, relaunching_ddp
from convseq.common.config import TrainerConfig
from convseq.evaluation.report import REPORT_FILES
from tests.conftest import ROOT
from tests.training_utils import TINY_MODEL


def test_multirun_of_two_jobs_writes_the_table_and_the_curves(tiny_data, tmp_path):
    sweep_dir, cwd = tmp_path / "sweep", tmp_path / "cwd"
    cwd.mkdir()
    env = {
        **os.environ,
        "CONVSEQ_CACHE": str(tiny_data["cache"]),
        "CONVSEQ_OUTPUTS": str(tmp_path / "outputs"),
        "OMP_NUM_THREADS": "1",  # the machine is shared: one thread per job
    }
    cmd = [
        sys.executable,
        str(ROOT / "run.py"),
        "-m",
        "optim.lr=0.1,0.2",
        "data.generator=null",
        f"data.dir={tiny_data['corpus']}",
        "batching.max_tokens=300",
        *TINY_MODEL,
        "trainer.enable_progress_bar=false",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=6",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"convseq: sweep report: {sweep_dir / REPORT_FILES['markdown']}" in proc.stdout
    assert list(cwd.iterdir()) == []

    summaries = [json.loads((sweep_dir / j / "summary.json").read_text()) for j in ("0", "1")]
    with open(sweep_dir / REPORT_FILES["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["overrides"]) for r in rows] == [
        ("0", "optim.lr=0.1"),
        ("1", "optim.lr=0.2"),
    ]
    for row, s, lr in zip(rows, summaries, (0.1, 0.2)):
        valid = [h["valid/loss"] for h in s["history"]]
        assert len(valid) == 2 and row["epochs"] == "2" and row["status"] == "ok"
        assert row["stop_reason"] == "reached trainer.max_epochs=2"
        assert float(row["best_valid_loss"]) == pytest.approx(min(valid))
        assert int(row["best_valid_epoch"]) == 1 + valid.index(min(valid))
        assert float(row["wall_seconds"]) == pytest.approx(s["train_seconds"])
        assert float(row["last_lr"]) == lr
        assert row["updates"] == "12"  # 2 epochs x 6 batches
    assert summaries[0]["history"] != summaries[1]["history"]  # two different runs

    record = json.loads((sweep_dir / REPORT_FILES["json"]).read_text())
    assert len(record["curves"]) == 2
    for curve, s, lr in zip(record["curves"], summaries, (0.1, 0.2)):
        assert curve["epoch"] == [1, 2]
        assert curve["valid_loss"] == pytest.approx([h["valid/loss"] for h in s["history"]])
        assert curve["lr"] == [lr, lr]
    png = (sweep_dir / REPORT_FILES["png"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    md = (sweep_dir / REPORT_FILES["markdown"]).read_text()
    assert md.count("| optim.lr=0.") == 2


@pytest.mark.parametrize(
    ("trainer", "expected"),
    [
        ({"strategy": "ddp", "devices": 2}, True),
        ({"strategy": "ddp", "devices": [0, 1]}, True),
        ({"strategy": "ddp", "devices": "auto"}, True),
        ({"strategy": "ddp", "devices": 1, "num_nodes": 2}, True),
        ({"strategy": "ddp", "devices": 1}, False),
        ({"strategy": "auto", "devices": 1}, False),
        ({"strategy": "ddp_spawn", "devices": 2}, False),
    ],
)
def test_which_settings_relaunch_the_command_line(trainer, expected):
    assert relaunching_ddp(TrainerConfig(**trainer)) is expected


def test_ddp_inside_a_local_multirun_is_refused_before_the_job_runs(tmp_path, capsys):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tests.conftest import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["trainer=ddp"], return_hydra_config=True)
    callback = SweepReport()
    with open_dict(cfg):
        cfg.hydra.mode = "RUN"
    callback.on_job_start(cfg, task_function=None)  # a single DDP run is fine
    with open_dict(cfg):
        cfg.hydra.mode = "MULTIRUN"
    with pytest.raises(SystemExit) as e:
        callback.on_job_start(cfg, task_function=None)
    assert e.value.code == 2
    assert "local multirun" in capsys.readouterr().err
    with open_dict(cfg):
        cfg.trainer.devices = 1
    callback.on_job_start(cfg, task_function=None)  # one process per job: fine
    with open_dict(cfg):
        cfg.trainer.devices = 2
        cfg.hydra.launcher._target_ = "hydra_plugins.x.SlurmLauncher"
    callback.on_job_start(cfg, task_function=None)  # SLURM starts the ranks itself: fine


def _installed(module: str) -> bool:
    """Whether `module` can be imported (a missing parent package counts as not installed)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.skipif(
    not _installed("hydra_plugins.hydra_submitit_launcher"),
    reason="hydra-submitit-launcher not installed (pip install -e '.[slurm]')",
)
def test_slurm_launcher_runs_one_task_per_device():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tests.conftest import CONF_DIR

    GlobalHydra.instance().clear()
    overrides = ["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4", "trainer.num_nodes=3"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.tasks_per_node, launcher.gpus_per_node, launcher.nodes) == (4, 4, 3)
    assert relaunching_ddp(cfg.trainer)  # ... and yet allowed: SLURM, not Lightning, starts them
