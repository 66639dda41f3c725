"""bench/bench_parallel_jobs.py --dry-run: its commands are ones convseq accepts (every override
composes), the two torchrun nodes meet at one address, and no thread variable reaches a run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import compose_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "bench_parallel_jobs.py"
sys.path.insert(0, str(ROOT / "bench"))
import bench_parallel_jobs  # noqa: E402


def _commands() -> dict[str, list[list[str]]]:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("CPU: ")  # the machine line
    found: dict[str, list[list[str]]] = {}
    for line in lines[1:]:
        head, _, cmd = line.partition(": ")
        found.setdefault(head, []).append(cmd.split())
    return found


def test_dry_run_prints_commands_that_compose():
    found = _commands()
    assert set(found) == {"sweep alone", "sweep sweep", "ddp lightning", "ddp torchrun"}
    for cmds in found.values():
        for cmd in cmds:
            args = cmd[cmd.index(str(ROOT / "run.py")) + 1 :]
            # a sweep's first value stands for its list
            overrides = [a.split(",")[0] for a in args if a != "-m" and not a.startswith("hydra")]
            cfg = compose_config(overrides)  # a misspelt key or option fails here
            assert cfg.trainer.max_epochs == 1
    sweep = found["sweep sweep"][0]
    assert "hydra/launcher=submitit_local" in sweep and "optim=nag,sgd" in sweep
    nodes = found["ddp torchrun"]
    assert [n[n.index("--node-rank") + 1] for n in nodes] == ["0", "1"]
    assert len({n[n.index("--master-port") + 1] for n in nodes}) == 1
    assert all("trainer.num_nodes=2" in n for n in nodes)


def test_runs_get_no_thread_variable(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    env = bench_parallel_jobs.child_env()
    assert "OMP_NUM_THREADS" not in env and "LOCAL_RANK" not in env
