"""A run folder's record is written once, by the command that owns the folder.

- A command refused in a folder that already holds a run (no `resume`, a truncated checkpoint to
  resume from, a setting refused before training) leaves every file of that run byte for byte
  as it was: `.hydra/*`, `run.log`, checkpoints, `summary.json`, and no staging folder.
- A new run that fails leaves its folder marked: `error.txt` with its one-line error, which the
  reports list as `failed: <error>`.
- In process (`convseq.common.run_record`): a staged record and its log lines replace the
  folder's when the command claims it (the log appended, the old error removed), and are
  deleted when it fails first.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict

from convseq.common.run_record import (
    RECORD_DIR,
    STAGED_PREFIX,
    claim_run_folder,
    record_dir,
    run_record,
)
from convseq.evaluation.report import write_report
from convseq.evaluation.sweep_jobs import load_job
from tests.conftest import ROOT
from tests.training_utils import TINY_MODEL, launch_env, tiny_corpus

OLD_RECORD = {
    ".hydra/config.yaml": b"task: train\noptim:\n  lr: 0.25\n",
    ".hydra/hydra.yaml": b"hydra:\n  mode: RUN\n",
    ".hydra/overrides.yaml": b"- optim=nag\n- trainer.max_epochs=2\n",
    "run.log": b"[10:00:00,000][convseq.train][INFO] - the first run\n",
    "summary.json": json.dumps({"epochs": 2, "history": []}).encode(),
    "csv/metrics.csv": b"epoch,step,train/loss\n0,0,9.5\n",
}
# a setting train refuses before the data-bin is built: a cosine schedule needs its length
REFUSED_SETTING = ["anneal=cosine", "max_update=0"]


def _existing_run(folder: Path, last_ckpt: bytes = b"a checkpoint") -> dict[str, bytes]:
    """A run folder as a finished run leaves it; returns its files, by relative path."""
    files = {**OLD_RECORD, "checkpoints/last.ckpt": last_ckpt, "checkpoints/best.ckpt": b"best"}
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return files


def _files(folder: Path) -> dict[str, bytes]:
    """Every file and folder under `folder` (folders as b"<dir>"), by relative path."""
    return {
        p.relative_to(folder).as_posix(): (b"<dir>" if p.is_dir() else p.read_bytes())
        for p in folder.rglob("*")
    }


def _run_py(tiny_data, folder: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`python run.py` of a tiny run over the tiny corpus in `folder`."""
    args = [
        *tiny_corpus(tiny_data),
        *TINY_MODEL,
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={folder}",
        *overrides,
    ]
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=folder.parent,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _truncated_checkpoint() -> bytes:
    buffer = io.BytesIO()
    torch.save({"state_dict": {"w": torch.zeros(64, 64)}, "global_step": 3}, buffer)
    return buffer.getvalue()[: len(buffer.getvalue()) // 2]


@pytest.mark.parametrize(
    ("case", "overrides", "said"),
    [
        ("existing run", ["optim=sgd", "trainer.max_epochs=7"], "this folder already holds a run"),
        # slow: the same staging path as the existing run's refusal above; a failure before the
        # claim is covered in process (test_a_staged_record_is_deleted_when_the_command_fails_before_its_claim)
        pytest.param("truncated checkpoint", ["resume=true"], "last.ckpt", marks=pytest.mark.slow),
        pytest.param(
            "refused setting", ["resume=true", *REFUSED_SETTING], "anneal", marks=pytest.mark.slow
        ),
    ],
)
def test_a_refused_command_changes_no_file_of_the_run_in_its_folder(
    tiny_data, tmp_path, case, overrides, said
):
    run = tmp_path / "run"
    truncated = case == "truncated checkpoint"
    written = _existing_run(run, _truncated_checkpoint() if truncated else b"a checkpoint")
    before = _files(run)
    proc = _run_py(tiny_data, run, *overrides)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert said in proc.stderr and "convseq: error:" in proc.stderr
    assert _files(run) == before, case  # no file changed, none added (no staging folder left)
    assert {k: before[k] for k in written} == written
    job = load_job(run, tmp_path)  # the report still reads the first run's overrides
    assert job.overrides == ["optim=nag", "trainer.max_epochs=2"] and job.status == "ok"


def test_a_new_run_that_fails_is_listed_as_failed_with_its_error(tiny_data, tmp_path):
    sweep = tmp_path / "runs"
    run = sweep / "new"
    sweep.mkdir()
    proc = _run_py(tiny_data, run, *REFUSED_SETTING)
    assert proc.returncode == 2, proc.stderr[-3000:]
    error = (run / "error.txt").read_text()
    assert error.endswith("\n") and error.count("\n") == 1
    message = proc.stderr.strip().splitlines()[-1].removeprefix("convseq: error: ")
    assert message in error  # the line the terminal showed, after the error's type
    overrides = (run / RECORD_DIR / "overrides.yaml").read_text()
    assert "anneal=cosine" in overrides and "max_update=0" in overrides
    rows = json.loads(write_report(sweep, plot=False)["json"].read_text())["rows"]
    assert [(r["job"], r["status"]) for r in rows] == [("new", f"failed: {error.strip()}")]


# ------------------------------------------------------------------ in process: run_record


@pytest.fixture
def hydra_job(tmp_path):
    """Sets Hydra's config for a single run in `tmp_path / "run"` (as run_job does), with a log
    file handler on its run.log; yields the folder."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from convseq.cli.schema import register_configs
    from tests.conftest import CONF_DIR

    folder = tmp_path / "run"
    folder.mkdir()
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", return_hydra_config=True)
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(folder)
        cfg.hydra.mode = "RUN"
    root = logging.getLogger()
    yield folder, cfg
    for handler in list(root.handlers):
        if getattr(handler, "baseFilename", "").startswith(str(folder)):
            root.removeHandler(handler)
            handler.close()
    HydraConfig.instance().cfg = None


def _start_job(folder: Path, cfg) -> Path:
    """What Hydra does before the task: choose the record folder (the resolver), write the
    record there and open run.log. Returns the record folder."""
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(cfg)
    record = folder / HydraConfig.get().output_subdir
    record.mkdir(exist_ok=True)
    (record / "overrides.yaml").write_text("- optim=sgd\n")
    (record / "config.yaml").write_text("task: train\n")
    handler = logging.FileHandler(folder / "run.log")
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger().addHandler(handler)
    return record


def test_a_staged_record_replaces_the_old_one_when_the_run_claims_the_folder(hydra_job):
    folder, cfg = hydra_job
    _existing_run(folder)
    (folder / "error.txt").write_text("SettingError: an earlier command's\n")
    record = _start_job(folder, cfg)
    assert record.name == f"{STAGED_PREFIX}{os.getpid()}"
    log = logging.getLogger("convseq.test_run_record")
    with run_record():
        log.warning("before the claim")
        assert (folder / "run.log").read_bytes() == OLD_RECORD["run.log"]
        assert claim_run_folder() and not claim_run_folder()  # once
        log.warning("after the claim")
    old_log = OLD_RECORD["run.log"].decode()
    assert (folder / "run.log").read_text() == old_log + "before the claim\nafter the claim\n"
    assert (folder / ".hydra" / "overrides.yaml").read_text() == "- optim=sgd\n"
    assert (folder / ".hydra" / "config.yaml").read_text() == "task: train\n"
    assert (folder / ".hydra" / "hydra.yaml").read_bytes() == OLD_RECORD[".hydra/hydra.yaml"]
    assert not record.exists() and not (folder / "error.txt").exists()


def test_a_staged_record_is_deleted_when_the_command_fails_before_its_claim(hydra_job):
    folder, cfg = hydra_job
    _existing_run(folder)
    before = _files(folder)
    _start_job(folder, cfg)
    with pytest.raises(SystemExit), run_record():
        logging.getLogger("convseq.test_run_record").warning("refused")
        raise SystemExit(2)
    assert _files(folder) == before
    logging.getLogger("convseq.test_run_record").warning("after the command")
    assert _files(folder) == before  # the log handler is no longer the folder's


def test_a_new_folder_takes_the_record_at_once_and_keeps_a_failure(hydra_job):
    folder, cfg = hydra_job
    record = _start_job(folder, cfg)
    assert record == folder / RECORD_DIR
    assert record_dir(str(folder)) == RECORD_DIR  # kept for the job, though .hydra exists now
    with pytest.raises(SystemExit), run_record():
        try:
            raise ValueError("max_update=0: the cosine schedule needs a length\nmore")
        except ValueError as cause:
            raise SystemExit(2) from cause
    error = "ValueError: max_update=0: the cosine schedule needs a length\n"
    assert (folder / "error.txt").read_text() == error
    assert (record / "overrides.yaml").read_text() == "- optim=sgd\n"
