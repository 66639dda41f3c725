"""bench/bench_lightconv_vs_fairseq_speed.py without fairseq: its batches are fairseq's layout, and
its --dry-run trains and translates with convseq's side at tiny sizes."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_lightconv_vs_fairseq_speed as bench  # noqa: E402


def test_batches_are_left_padded_sources_and_shifted_targets():
    src = [torch.tensor([5, 6, 2]), torch.tensor([7, 2])]
    tgt = [torch.tensor([8, 2]), torch.tensor([9, 10, 2])]
    src_tokens, lengths, prev, target = bench.train_batch(src, tgt)
    assert src_tokens.tolist() == [[5, 6, 2], [1, 7, 2]] and lengths.tolist() == [3, 2]
    assert target.tolist() == [[8, 2, 1], [9, 10, 2]]
    assert prev.tolist() == [[2, 8, 1], [2, 9, 10]]


def test_dry_run_trains_and_translates_with_convseq():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_lightconv_vs_fairseq_speed.py"), "--dry-run",
         "--threads", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    train, generate = json.loads(lines["train"]), json.loads(lines["generate"])
    assert train["tokens"] > 0 and train["first_loss"] > 0
    assert generate["tokens"] > 0 and generate["seconds"] > 0


def test_report_gives_medians_ratios_and_differing_hypotheses(monkeypatch, capsys):
    runs = {
        "convseq": {"tokens": 10, "seconds": 1.0, "cpu_seconds": 2.0, "hyps": [[4, 2], [5, 2]]},
        "fairseq": {"tokens": 10, "seconds": 2.0, "cpu_seconds": 2.0, "hyps": [[4, 2], [6, 2]]},
    }
    monkeypatch.setattr(bench, "run_side", lambda side, *_: dict(runs[side]))
    args = argparse.Namespace(baseline_src=None, repeats=3)
    out = bench.compare("generate", Path("case.pt"), args)
    assert out["ratio_tps"] == 2.0 and out["ratio_tps_cpu"] == 1.0
    assert out["hyps_differing"] == 1 and out["sentences"] == 2
    assert "generate repeat 3" in capsys.readouterr().out
