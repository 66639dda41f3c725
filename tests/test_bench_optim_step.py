"""bench/bench_optim_step.py's --dry-run: the table and JSON it writes, and what they count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_optim_step.py"


def test_dry_run_counts_four_ops_per_tensor_against_four_per_dtype(tmp_path):
    out = tmp_path / "step.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--dry-run", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("CPU: ")  # the machine line first
    result = json.loads(out.read_text())
    # fconv_toy: every tensor float32 on one device -> 4 multi-tensor ops in all
    assert result["ops_per_step"] == {"per_parameter": 4 * result["parameters"], "foreach": 4}
    assert result["parameters"] > 10 and len(result["ms_runs"]["foreach"]) == 2
    assert f"| foreach | 4 | {result['ms_per_step']['foreach']:.2f} |" in proc.stdout
