"""Benchmark: time per training update of the same run on two source trees (before and after).

Each tree trains the study's small fconv (`experiment=multi30k_study`: 2.7M parameters, NAG,
token batches) on Multi30k through `train()`, as `python run.py` does, for `--warmup` untimed and
`--updates` timed updates of epoch 1 (same seed, so the same batches and weights on both sides).
The time of an update is the wall time from one batch end to the next (forward, backward, the
optimiser step, the progress output and Lightning's hooks, all of it). Each repeat runs the two
trees in fresh processes, alternating which goes first; the figure of a run is the median of its
updates, the table's the median of the repeats.

"before" is a git revision checked out beside the project (outputs/bench_trees/<rev>, a git
worktree); "after" is this checkout. The default revision is the last commit before the GPU
readiness work (foreach NAG, one host sync per update).

    python bench/bench_update_time.py                          # 5 repeats of 10 + 100 updates
    python bench/bench_update_time.py --before HEAD~3 --repeats 3 --json outputs/update.json
    python bench/bench_update_time.py --dry-run                # toy data, tiny model, this tree twice
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data"
BEFORE = "231f29b"  # before foreach NAG and the host-sync work


# -- one run, in the child process ----------------------------------------------------------------
def child(tree: Path, out_dir: Path, cache: Path, total: int, dry: bool) -> list[float]:
    """Train `total` updates with `tree`'s convseq and config; each update's wall seconds."""
    import pytorch_lightning as pl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from convseq.tasks.train import train

    # the child may run an older tree's convseq (the "before" side): its layout's own names
    try:  # convseq.cli (the command line's machinery moved out of tasks/)
        from convseq.cli.schema import register_configs
    except ImportError:
        from convseq.tasks.schema import register_configs
    try:  # typed configs: the composed config as the task's dataclass
        from convseq.tasks.config import as_config as task_config
    except ImportError:  # plain dicts
        from convseq.common.plain import to_plain as task_config
    # a config per task (conf/train.yaml), or one root config (conf/config.yaml)
    config_name = "train" if (tree / "conf" / "train.yaml").is_file() else "config"

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            self.ends.append(time.perf_counter())

    if dry:  # this tree only (bench/gpu_common.py imports this checkout's convseq)
        from gpu_common import TINY_MODEL

        data = TINY_MODEL
    else:
        data = ["experiment=multi30k_study", f"paths.data_root={DATA_ROOT}"]
    overrides = [
        *data,
        f"paths.cache_dir={cache}",
        f"max_update={total}",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        "final_test=false",
    ]
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(tree / "conf"), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=overrides)
    GlobalHydra.instance().clear()
    cfg.paths.output_dir = str(out_dir)
    clock = Clock()
    train(task_config(cfg), callbacks=[clock])
    return [b - a for a, b in zip(clock.ends, clock.ends[1:])]


# -- the parent: trees, alternating runs, the table -----------------------------------------------
def tree_of(rev: str) -> Path:
    """A worktree of `rev` under outputs/bench_trees/ (made once, reused)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    path = ROOT / "outputs" / "bench_trees" / sha
    if not (path / "src" / "convseq").is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "worktree", "add", "-f", "--detach", str(path), sha], cwd=ROOT, check=True
        )
    return path


def run_tree(tree: Path, cache: Path, total: int, dry: bool) -> list[float]:
    """One fresh process training with `tree`'s sources; its per-update seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "seconds.json"
        env = {**os.environ, "PYTHONPATH": str(tree / "src")}
        cmd = [sys.executable, __file__, "--child", str(tree), "--child-out", str(result)]
        cmd += ["--cache", str(cache), "--total", str(total)] + (["--dry-run"] if dry else [])
        proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"the run of {tree} failed:\n{proc.stderr[-3000:]}")
        return json.loads(result.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", default=BEFORE, help="git revision of the 'before' tree")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--updates", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--dry-run", action="store_true", help="toy data, tiny model, this tree twice")
    ap.add_argument("--cache", type=Path, default=ROOT / "outputs" / "bench_cache")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--total", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        out = Path(tempfile.mkdtemp()) / "run"
        seconds = child(args.child, out, args.cache, args.total, args.dry_run)
        args.child_out.write_text(json.dumps(seconds))
        return
    # bench/, beside this script; imported here, as a child may run an older convseq
    from machine import machine, machine_line

    if args.dry_run:
        args.warmup, args.updates, args.repeats = 2, 3, 2
        trees = {"before": ROOT, "after": ROOT}
    else:
        if not (DATA_ROOT / "multi30k").is_dir():
            raise SystemExit(f"{DATA_ROOT / 'multi30k'}: Multi30k is not there")
        trees = {"before": tree_of(args.before), "after": ROOT}
    total = args.warmup + args.updates + 1  # the first update has no batch end before it
    print(machine_line(), flush=True)
    runs: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(args.repeats):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for name in order:
            seconds = run_tree(trees[name], args.cache, total, args.dry_run)[args.warmup :]
            runs[name].append(statistics.median(seconds) * 1000)
            print(f"repeat {r + 1} {name}: {runs[name][-1]:.1f} ms/update", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"\n| tree | revision | ms per update (median of {args.repeats}) |")
    print("|---|---|---|")
    for name in ("before", "after"):
        rev = "this checkout" if trees[name] == ROOT else args.before
        print(f"| {name} | {rev} | {med[name]:.1f} |")
    print(f"\nafter / before: {med['after'] / med['before']:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record: dict[str, Any] = {
            "machine": machine(),
            "before": args.before if not args.dry_run else "this checkout",
            "updates": args.updates,
            "warmup": args.warmup,
            "ms_runs": runs,
            "ms_per_update": med,
            "ratio": med["after"] / med["before"],
        }
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
