"""Sweeps through hydra-submitit-launcher (the `slurm` extra): its local executor, and the SLURM
launcher's settings composed (no SLURM at hand).

`hydra/launcher=submitit_local` runs every job as its own submitit job (a pickled job, a separate
process, logs under `<sweep>/.submitit/<job id>/`); the report is written by the parent process
once every job has returned, as with the basic launcher, and must hold the same rows.
"""

from __future__ import annotations

import copy
import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import open_dict

from convseq.cli.hydra_callbacks import SweepReport
from convseq.evaluation.report import REPORT_FILES
from tests.conftest import ROOT
from tests.training_utils import TINY_MODEL


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package
        return False


pytestmark = pytest.mark.skipif(
    not (_installed("hydra_plugins.hydra_submitit_launcher") and _installed("submitit")),
    reason="hydra-submitit-launcher not installed (pip install -e '.[slurm]')",
)

# Figures that depend on the machine's load, not on the job: left out of the comparison.
TIMES = ("wall_seconds", "seconds_per_epoch")
FAILED_LR = "-1"  # passes the command line, refused when the job builds its optimiser
ONE_CPU = "hydra.launcher.cpus_per_task=1"  # the machine is shared: one thread a job


def _sweep(
    tiny_data, tmp_path: Path, name: str, *launcher: str
) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """Three one-epoch jobs (the last one fails at run time) under the given launcher."""
    sweep_dir, cwd = tmp_path / name, tmp_path / f"{name}_cwd"
    cwd.mkdir()
    env = {
        **os.environ,
        "CONVSEQ_CACHE": str(tiny_data["cache"]),
        "CONVSEQ_OUTPUTS": str(tmp_path / "outputs"),
        "OMP_NUM_THREADS": "1",  # the jobs of a submitit_local sweep run at once
    }
    cmd = [
        sys.executable,
        str(ROOT / "run.py"),
        "-m",
        *launcher,
        f"optim.lr=0.1,0.2,{FAILED_LR}",
        "data.generator=null",
        f"data.dir={tiny_data['corpus']}",
        "batching.max_tokens=300",
        *TINY_MODEL,
        "trainer.enable_progress_bar=false",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=4",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=400)
    return sweep_dir, cwd, proc


def _rows(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / REPORT_FILES["csv"], newline="") as f:
        return [{k: v for k, v in r.items() if k not in TIMES} for r in csv.DictReader(f)]


# slow: the default run covers a multirun's report (tests/tasks/test_sweep.py) and the launcher's
# config (test_slurm_launcher_composes)
@pytest.mark.slow
def test_submitit_local_sweep_reports_what_the_basic_launcher_reports(tiny_data, tmp_path):
    basic, basic_cwd, b = _sweep(tiny_data, tmp_path, "basic")
    local, local_cwd, s = _sweep(
        tiny_data, tmp_path, "submitit", "hydra/launcher=submitit_local", ONE_CPU
    )
    # the failed job fails the command (convseq's exit status 2 from the job, Hydra's 1 when
    # submitit hands back a job without a result) ...
    assert b.returncode == 2, b.stderr[-3000:]
    assert s.returncode == 1, s.stderr[-3000:]
    refused = "optim.lr must be a number >= 0, got -1.0"
    assert refused in b.stderr and refused in s.stderr
    # ... and the report is written all the same, by the process that launched the jobs
    for sweep_dir, proc in ((basic, b), (local, s)):
        assert f"convseq: sweep report: {sweep_dir / REPORT_FILES['markdown']}" in proc.stdout

    rows = _rows(local)
    assert rows == _rows(basic)  # same jobs, same figures
    assert [(r["job"], r["overrides"], r["status"]) for r in rows] == [
        ("0", "optim.lr=0.1", "ok"),
        ("1", "optim.lr=0.2", "ok"),
        ("2", f"optim.lr={FAILED_LR}", f"failed: OptimConfigError: {refused}"),
    ]
    assert rows[0]["best_valid_loss"] != rows[1]["best_valid_loss"]  # two different runs
    curves = [json.loads((d / REPORT_FILES["json"]).read_text())["curves"] for d in (basic, local)]
    assert curves[0] == curves[1] and len(curves[0]) == 3

    # Hydra's output folder under submitit: each job's own folder, nothing in the cwd
    assert list(basic_cwd.iterdir()) == [] and list(local_cwd.iterdir()) == []
    for job in ("0", "1"):
        assert (local / job / "summary.json").is_file()
        assert (local / job / "checkpoints" / "last.ckpt").is_file()
        hydra_yaml = (local / job / ".hydra" / "hydra.yaml").read_text()
        assert f"output_dir: {local / job}\n" in hydra_yaml
    assert (local / "2" / "error.txt").read_text() == f"OptimConfigError: {refused}\n"

    # submitit's job folders: one per job, its pickled job and its logs; the report is not
    # written by any job
    folders = sorted(p for p in (local / ".submitit").iterdir() if p.name != "%j")
    assert len(folders) == 3
    logs = {}
    for folder in folders:
        job_id = folder.name
        assert (folder / f"{job_id}_submitted.pkl").is_file()
        out = (folder / f"{job_id}_0_log.out").read_text()
        err = (folder / f"{job_id}_0_log.err").read_text()
        assert "sweep report" not in out + err
        logs[job_id] = err
    failed = [j for j, err in logs.items() if refused in err]
    assert len(failed) == 1  # the failed job's error is in its own log only
    assert not (local / ".submitit" / failed[0] / f"{failed[0]}_0_result.pkl").exists()


def test_slurm_launcher_composes_with_its_settings():
    """`--cfg all --resolve -p hydra.launcher` prints what each SLURM job would ask for."""
    cmd = [
        sys.executable,
        str(ROOT / "run.py"),
        "hydra/launcher=slurm",
        "hydra.launcher.partition=gpu",
        "hydra.launcher.timeout_min=60",
        "trainer=ddp",
        "trainer.devices=4",
        "trainer.num_nodes=2",
        "hydra.sweep.dir=sweeps/s",
        "--cfg",
        "all",
        "--resolve",
        "-p",
        "hydra.launcher",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = set(proc.stdout.splitlines())
    for expected in (
        "_target_: hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
        "partition: gpu",
        "timeout_min: 60",
        "signal_delay_s: 120",
        "tasks_per_node: 4",
        "gpus_per_node: 4",
        "nodes: 2",
        "max_num_timeout: 0",
        "submitit_folder: sweeps/s/.submitit/%j",
    ):
        assert expected in lines, proc.stdout


def test_multi_process_ddp_is_refused_under_submitits_local_executor(capsys):
    """Lightning would re-run submitit's job runner with Hydra's arguments in each extra rank."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from convseq.cli.schema import register_configs
    from tests.conftest import CONF_DIR

    register_configs()
    GlobalHydra.instance().clear()
    overrides = ["hydra/launcher=submitit_local", "trainer=ddp", "trainer.accelerator=cpu"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.mode = "MULTIRUN"
    with pytest.raises(SystemExit) as e:
        SweepReport().on_job_start(cfg, task_function=None)
    assert e.value.code == 2
    assert "submitit's job runner" in capsys.readouterr().err
    with open_dict(cfg):
        cfg.trainer.devices = 1
    SweepReport().on_job_start(cfg, task_function=None)  # one process per job: fine


def test_a_failed_sweep_job_leaves_its_error_and_a_signalled_one_does_not(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from convseq.cli.hydra_callbacks import job_errors
    from convseq.cli.schema import register_configs
    from tests.conftest import CONF_DIR

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", return_hydra_config=True)
    error = tmp_path / "error.txt"
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path)
    cases = [
        ("MULTIRUN", SystemExit(75), None),  # cut by a signal: summary.json says so
        ("MULTIRUN", SystemExit(0), None),
        ("RUN", ValueError("bad"), None),  # a single run: its error is on the terminal
        ("MULTIRUN", ValueError("bad\nsecond line"), "ValueError: bad\n"),
        ("MULTIRUN", SystemExit("convseq: unknown task='x'"), "convseq: unknown task='x'\n"),
    ]
    try:
        for mode, exc, expected in cases:
            error.unlink(missing_ok=True)
            job_cfg = copy.deepcopy(cfg)  # set_config makes it read-only
            with open_dict(job_cfg):
                job_cfg.hydra.mode = mode
            HydraConfig.instance().set_config(job_cfg)
            with pytest.raises(type(exc)), job_errors():
                raise exc
            assert (error.read_text() if error.exists() else None) == expected, (mode, exc)
        try:  # convseq's one-line errors: SystemExit(2) raised from the ConvseqError
            raise KeyError("no such split")
        except KeyError as cause:
            with pytest.raises(SystemExit), job_errors():
                raise SystemExit(2) from cause
        assert error.read_text() == "KeyError: 'no such split'\n"
    finally:
        HydraConfig.instance().cfg = None
