"""The job log of `python run.py > file`: a progress line every log_every_n_steps updates with
the figures csv/metrics.csv holds at those updates, a line per validation, checkpoint and stop,
the same lines in run.log, JSON records that parse line by line, a resumed run's lines
continuing the update count, and the start-up header."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from convseq.common.config import TrainerConfig
from convseq.errors import SettingError
from convseq.training.progress import format_record, progress_mode
from tests.conftest import ROOT
from tests.training_utils import TINY_MODEL, launch_env

EVERY = 5  # trainer.log_every_n_steps of these runs
PREFIX = "[convseq.progress][INFO] - "


def _run(tiny_data, run_dir: Path, *overrides: str, env: dict | None = None) -> str:
    """`python run.py ... > out.txt 2>&1` (stdout a file, as under a scheduler); its output."""
    out = run_dir.parent / f"{run_dir.name}-{len(list(run_dir.parent.iterdir()))}.txt"
    cmd = [
        sys.executable,
        str(ROOT / "run.py"),
        "data.generator=null",
        f"data.dir={tiny_data['corpus']}",
        f"paths.cache_dir={tiny_data['cache']}",
        "batching.max_tokens=300",  # 18 updates an epoch
        *TINY_MODEL,
        f"trainer.log_every_n_steps={EVERY}",
        "gen.test_bleu=false",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    with open(out, "w") as f:
        proc = subprocess.run(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env or launch_env(), timeout=600
        )
    text = out.read_text()
    assert proc.returncode == 0, text[-3000:]
    return text


def _metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    """metrics.csv's per-update rows by step."""
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        int(r["step"]): {k[6:]: float(v) for k, v in r.items() if k.startswith("train/") and v}
        for r in rows
        if r.get("train/loss")
    }


def _progress(text: str) -> list[str]:
    return [line.split(PREFIX, 1)[1] for line in text.splitlines() if PREFIX in line]


@pytest.fixture(scope="module")
def two_runs(tiny_data, tmp_path_factory):
    """One epoch with text lines, then the same run resumed to 2 epochs with JSON records."""
    run_dir = tmp_path_factory.mktemp("progress") / "run"
    first = _run(tiny_data, run_dir, "trainer.max_epochs=1", "trainer.progress=lines")
    run_log_first = (run_dir / "run.log").read_text()
    env = launch_env()
    env.pop("OMP_NUM_THREADS")
    second = _run(
        tiny_data,
        run_dir,
        "trainer.max_epochs=2",
        "trainer.progress=json",
        "resume=true",
        "trainer.threads=1",
        env=env,
    )
    return {"dir": run_dir, "first": first, "second": second, "run_log_first": run_log_first}


def test_text_lines_every_interval_with_the_csv_figures(two_runs):
    lines = _progress(two_runs["first"])
    # the lines of logged updates (a line by time, 30 s after the last, holds no figures)
    updates = [line for line in lines if " | update " in line and "| loss " in line]
    counts = [int(re.search(r"update (\d+)/18 \((\d+)\)", u).group(2)) for u in updates]
    assert counts == [5, 10, 15]  # every 5 updates, as metrics.csv
    metrics = _metrics(two_runs["dir"])
    assert sorted(metrics)[:3] == [4, 9, 14]
    for line, n in zip(updates, counts):
        row = metrics[n - 1]  # metrics.csv's step counts from 0
        assert f"| loss {row['loss']:.4g} |" in line
        assert f"| nll {row['nll_loss']:.4g} |" in line
        assert f"| lr {row['lr']:.4g} |" in line
        assert "| elapsed 0:00:" in line and "| epoch eta " in line
    valid = [line for line in lines if " | valid " in line]
    assert len(valid) == 1 and "best valid/loss" in valid[0] and "| lr " in valid[0]
    saved = [line for line in lines if "saved checkpoints/" in line]
    assert any("best.ckpt" in s for s in saved) and any("last.ckpt" in s for s in saved)
    assert lines[-1].startswith("stopped: reached trainer.max_epochs=1 | epochs 1 | updates 18")
    # the order a reader expects: the epoch's updates, its validation, its checkpoints, the stop
    assert lines.index(updates[-1]) < lines.index(valid[0]) < lines.index(saved[0])


def test_run_log_holds_the_same_lines(two_runs):
    stdout = [line for line in two_runs["first"].splitlines() if PREFIX in line]
    in_file = [line for line in two_runs["run_log_first"].splitlines() if PREFIX in line]
    assert stdout and in_file == stdout


def test_the_header(two_runs):
    text = two_runs["first"]
    header = [
        line.split("[convseq.train][INFO] - ", 1)[1]
        for line in text.splitlines()
        if "[convseq.train]" in line
    ]
    joined = "\n".join(header)
    assert re.search(r"^convseq \S+, torch \S+, Lightning \S+$", header[0])
    assert "CPU " in joined and "parameters" in joined
    # trainer.tf32's default, set by the command before the header is written
    assert "precision 32-true, TF32 on (trainer.tf32, CUDA only: unused here), cpu" in joined
    assert "threads per process: 1 (OMP_NUM_THREADS)" in joined  # the tests' environment
    assert "train 300 sentences" in joined and "valid 40 sentences" in joined
    assert f"run folder {two_runs['dir']}" in joined
    second = two_runs["second"]
    assert "threads per process: 1 (trainer.threads)" in second
    # third-party noise is gone from the log
    assert "litlogger" not in text and "LeafSpec" not in text


def test_json_records_parse_and_match_the_csv_after_resume(two_runs):
    records = [json.loads(line) for line in two_runs["second"].splitlines() if line.startswith("{")]
    kinds = {r["kind"] for r in records}
    assert kinds == {"update", "valid", "checkpoint", "stop"}
    updates = [r for r in records if r["kind"] == "update" and r["logged"]]
    # the resumed run continues the count: the second epoch's updates 19..36
    assert [r["updates"] for r in updates] == [20, 25, 30, 35]
    assert [r["epoch_update"] for r in updates] == [2, 7, 12, 17]
    assert all(r["epoch"] == 2 and r["epoch_eta"] >= 0 for r in updates)
    metrics = _metrics(two_runs["dir"])
    for r in updates:
        row = metrics[r["step"]]
        for name in ("loss", "nll_loss", "ppl", "lr", "gnorm", "wps", "ups"):
            assert r[name] == row[name], name
    valid = [r for r in records if r["kind"] == "valid"]
    assert len(valid) == 1 and valid[0]["epoch"] == 2 and valid[0]["updates"] == 36
    assert records[-1]["kind"] == "stop" and records[-1]["updates"] == 36
    # run.log gets the same bare records
    in_file = [
        x for x in (two_runs["dir"] / "run.log").read_text().splitlines() if x.startswith("{")
    ]
    assert [json.loads(x) for x in in_file] == records


def test_progress_mode():
    assert progress_mode(TrainerConfig(progress="auto"), interactive=True) == "bar"
    assert progress_mode(TrainerConfig(progress="auto"), interactive=False) == "lines"
    # enable_progress_bar=false: no bar on a terminal; off it, lines as before
    off = TrainerConfig(progress="auto", enable_progress_bar=False)
    assert progress_mode(off, interactive=True) == "none"
    assert progress_mode(off, interactive=False) == "lines"
    assert progress_mode(TrainerConfig(progress="bar", enable_progress_bar=False)) == "none"
    assert progress_mode(TrainerConfig(progress="json"), interactive=True) == "json"
    with pytest.raises(SettingError, match="trainer.progress='lnes'"):
        progress_mode(TrainerConfig(progress="lnes"))


def test_format_record():
    line = format_record(
        {
            "kind": "update",
            "epoch": 2,
            "epoch_update": 300,
            "epoch_updates": 536,
            "updates": 836,
            "loss": 4.1234,
            "nll_loss": 3.9,
            "ppl": 15.0,
            "lr": 0.25,
            "gnorm": 0.81,
            "wps": 12400.4,
            "ups": 25.1,
            "elapsed": 33.2,
            "epoch_eta": 3661,
        }
    )
    assert line == (
        "epoch 2 | update 300/536 (836) | loss 4.123 | nll 3.9 | ppl 15 | lr 0.25 | gnorm 0.81"
        " | wps 12400 | ups 25.1 | elapsed 0:00:33 | epoch eta 1:01:01"
    )
