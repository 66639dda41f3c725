"""bench/bench_conv_layers_vs_fairseq.py's --dry-run (convseq's side only, no fairseq), and its
fairseq side's independence from convseq."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_dry_run_prints_the_machine_line_and_agreeing_forms(tmp_path):
    out = tmp_path / "conv.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_conv_layers_vs_fairseq.py"), "--dry-run"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("CPU: ")  # the machine line first
    result = json.loads(out.read_text())
    assert result["dry_run"] and result["machine"]["model"]
    layers = [row["case"]["layer"] for row in result["rows"]]
    assert layers == ["lightweight", "dynamic"]
    for row in result["rows"]:
        diffs = [row["diff"][c] for c in ("band", "steps", "chunks convseq")]
        assert all(d < 1e-6 for d in diffs), row  # the forms agree with the unfold form


def test_layer_dry_run_decodes_as_the_untrimmed_forward(tmp_path):
    out = tmp_path / "layers.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_lightconv_layers_vs_fairseq.py"), "--dry-run"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("CPU: ")
    (row,) = json.loads(out.read_text())["rows"]
    assert row["case"]["T"] < row["case"]["K"] and row["diff"]["steps"] < 1e-6


@pytest.mark.parametrize(
    "side",
    ["conv_layers_fairseq_side.py", "lightconv_layers_fairseq_side.py", "fairseq_cases_side.py"],
)
def test_the_fairseq_side_imports_no_convseq(side):
    """They run with the fairseq venv's Python, which has no convseq."""
    tree = ast.parse((BENCH / side).read_text(encoding="utf-8"))
    names = {alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(name.startswith("convseq") for name in names)
    assert side == "fairseq_cases_side.py" or "fairseq_cases_side" in names  # one home
