"""bench/bench_update_time.py's --dry-run: the table and JSON of two alternating trees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_update_time.py"


# slow: four child trainings; the training path it times is the default run's (tests/tasks)
@pytest.mark.slow
def test_dry_run_times_both_trees_alternately_and_reports_the_ratio(tmp_path):
    out = tmp_path / "update.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--dry-run", "--json", str(out), "--cache", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("CPU: ")  # the machine line first
    result = json.loads(out.read_text())
    runs = result["ms_runs"]
    assert len(runs["before"]) == len(runs["after"]) == 2
    assert all(ms > 0 for ms in runs["before"] + runs["after"])
    order = [line.split()[2] for line in proc.stdout.splitlines() if line.startswith("repeat")]
    assert order == ["before:", "after:", "after:", "before:"]  # alternating first runs
    ratio = result["ms_per_update"]["after"] / result["ms_per_update"]["before"]
    assert abs(result["ratio"] - ratio) < 1e-12
    assert f"after / before: {ratio:.3f}" in proc.stdout
