"""What both halves of bench/bench_vs_fairseq.py share (training there, generation in
bench_vs_fairseq_gen.py): the paths, fairseq's environment, a side run in a fresh process, the
machine line on top and the report of convseq's figures against fairseq's."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from machine import machine, machine_line  # bench/, beside this module (on sys.path as a script)

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / "bench" / "fairseq-venv"
WORK = ROOT / "outputs" / "bench_vs_fairseq"
DRIVER = ROOT / "bench" / "bench_vs_fairseq.py"  # the script both halves run as


def fairseq_env(threads: int) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    env.pop("PYTHONPATH", None)
    return env


def in_child(side: str, args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """Run `side` of bench_vs_fairseq.py in a fresh process; its JSON result."""
    cmd = [sys.executable, str(DRIVER), *extra, "--child", side]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{side} child failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def machine_of_run(threads: int) -> dict[str, Any]:
    """This machine (torch at the children's thread count), its line printed: the report's top.

    The children run on the same machine; the parent names it once, for both toolkits.
    """
    import torch

    torch.set_num_threads(threads)
    info = machine()
    print(machine_line(info), flush=True)
    return info


def report(title: str, runs: dict[str, list[dict]], key: str, args: argparse.Namespace) -> dict:
    c = [r[key] for r in runs["convseq"]]
    f = [r[key] for r in runs["fairseq"]]
    paired = [a / b for a, b in zip(c, f, strict=True)]
    out = {
        "title": title,
        "convseq_median": statistics.median(c),
        "fairseq_median": statistics.median(f),
        "ratio_of_medians": statistics.median(c) / statistics.median(f),
        "paired_ratio_median": statistics.median(paired),
        "paired_ratio_range": [min(paired), max(paired)],
        "repeats": len(c),
        "threads": args.threads,
    }
    print(f"\n{title} (medians of {len(c)} alternating runs, {args.threads} threads)")
    print(
        f"  convseq {out['convseq_median']:.1f}  fairseq {out['fairseq_median']:.1f}  "
        f"ratio {out['ratio_of_medians']:.2f}x (paired {out['paired_ratio_median']:.2f}x, "
        f"{min(paired):.2f}-{max(paired):.2f})"
    )
    return out


def fairseq_cases(side: Path, cases: list[dict[str, Any]], threads: int) -> list[dict[str, Any]]:
    """fairseq's outputs of `cases` from the case script `side` (`fairseq_cases_side.serve`), run
    in its own process with the fairseq venv's Python."""
    import tempfile

    import torch

    with tempfile.TemporaryDirectory() as tmp:
        cases_path, out_path = Path(tmp) / "cases.pt", Path(tmp) / "out.pt"
        torch.save(cases, cases_path)
        cmd = [str(VENV / "bin" / "python"), str(side), "--cases", str(cases_path)]
        cmd += ["--out", str(out_path), "--threads", str(threads)]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=fairseq_env(threads), check=False
        )
        if proc.returncode != 0:
            raise SystemExit(f"fairseq side failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
        return torch.load(out_path, weights_only=True)


def max_diff(a: Any, b: Any) -> float:
    """The largest absolute difference of two tensors."""
    return (a - b).abs().max().item()
