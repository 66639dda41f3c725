"""bench/bench_shared_machine.py --dry-run: its commands are ones convseq accepts, each arm's
runs get exactly the arm's wait setting (none of this process's), and bad arms are refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import compose_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "bench_shared_machine.py"
sys.path.insert(0, str(ROOT / "bench"))
import bench_shared_machine as bench  # noqa: E402


def test_dry_run_names_the_machine_the_arms_and_commands_that_compose():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("CPU: ")
    assert lines[1:3] == [
        "arm convseq: (nothing set)",
        f"arm fixed: OMP_NUM_THREADS={bench.CPUS}",  # every CPU, fixed: no following
    ]
    commands = {line.split(": ", 1)[0]: line.split(": ", 1)[1].split() for line in lines[3:]}
    assert set(commands) == {"train", "generate"}
    train = [a for a in commands["train"][2:] if not a.startswith("hydra.")]
    assert compose_config(train).max_update == 100  # a misspelt key would fail here
    generate = [a for a in commands["generate"][2:] if not a.startswith("hydra.")]
    assert compose_config(generate).ckpt.endswith("ckpt.ckpt")


def test_an_arms_runs_get_its_setting_and_nothing_of_this_process(monkeypatch, tmp_path):
    monkeypatch.setenv("GOMP_SPINCOUNT", "77")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    name, arm = bench.parse_arm("passive=OMP_WAIT_POLICY=PASSIVE")
    env = bench.child_env(arm, tmp_path)
    assert name == "passive" and env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert not {"GOMP_SPINCOUNT", "OMP_NUM_THREADS"} & set(env)
    assert env["CONVSEQ_CACHE"] == str(tmp_path)
    assert bench.parse_arm("convseq=") == ("convseq", {})


@pytest.mark.parametrize(
    "bad", ["nameless", "=GOMP_SPINCOUNT=1", "x=LD_PRELOAD=evil.so", "x=GOMP_SPINCOUNT"]
)
def test_a_bad_arm_is_refused_naming_it(bad):
    with pytest.raises(SystemExit) as e:
        bench.parse_arm(bad)
    assert repr(bad) in str(e.value)


def test_the_summary_takes_medians_and_ratios_to_the_run_alone():
    rounds = [
        {"alone": [10.0], "together": [20.0, 30.0], "said": "a"},
        {"alone": [12.0], "together": [18.0, 26.0], "said": "b"},
        {"alone": [11.0], "together": [40.0, 22.0], "said": "c"},
    ]
    s = bench.summarise(rounds)
    assert s["alone_s"] == 11.0
    assert s["together_s"] == [
        30.0,
        20.0,
    ]  # medians of the slower (30, 26, 40) and faster (20, 18, 22)
    assert s["ratio"] == pytest.approx([30 / 11, 20 / 11])
