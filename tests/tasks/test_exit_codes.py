"""`python run.py ... resume=auto` as a job script runs it: SIGTERM'd, it exits 75 (EX_TEMPFAIL);
the same command again continues the run and, finished, exits 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.training_utils import QUIET, TINY_MODEL, launch_env


def _run_py(tiny_data, run_dir) -> subprocess.Popen:
    """The one command of a job script: the same for the first launch and every requeue."""
    cmd = [
        sys.executable,
        str(ROOT / "run.py"),
        "data.generator=null",
        f"data.dir={tiny_data['corpus']}",
        f"paths.cache_dir={tiny_data['cache']}",
        "batching.max_tokens=100",  # ~55 updates an epoch: the signal lands inside the run
        *TINY_MODEL,
        *QUIET,
        "trainer.max_epochs=6",
        "gen.max_len_b=12",
        f"hydra.run.dir={run_dir}",
        "resume=auto",
    ]
    env = launch_env(CONVSEQ_CACHE=str(tiny_data["cache"]))
    return subprocess.Popen(
        cmd,
        cwd=run_dir.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# slow: the default run covers SIGTERM's exit 75 and the same command finishing the run
# (tests/training/test_slurm_requeue.py, resume=auto)
@pytest.mark.slow
def test_sigterm_exits_75_and_the_same_command_finishes_the_run_with_0(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    proc = _run_py(tiny_data, run_dir)
    last = run_dir / "checkpoints" / "last.ckpt"  # first written at the end of epoch 1
    deadline = time.monotonic() + 240
    while not last.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert last.exists(), proc.communicate()[1][-4000:] if proc.poll() is not None else "timeout"
    proc.send_signal(signal.SIGTERM)  # as a scheduler does before its time limit
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err[-4000:]
    first = json.loads((run_dir / "summary.json").read_text())
    assert first["signal"] == "SIGTERM" and first["exit_status"] == 75
    assert first["stopped_at"]["epoch"] >= 2 and first["stopped_at"]["epoch"] <= 6
    (line,) = [x for x in out.splitlines() if x.startswith("convseq: interrupted by SIGTERM")]
    assert "continue it with resume=auto" in line

    again = _run_py(tiny_data, run_dir)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-4000:]
    done = json.loads((run_dir / "summary.json").read_text())
    assert done["resumed_from"] == str(last) and done["signal"] is None
    assert done["epochs"] == 6 and done["stop_reason"] == "reached trainer.max_epochs=6"
    assert "convseq: 6 epochs" in out
