"""Soak benchmark: resident memory (RSS) of one long training run, epoch after epoch.

Trains the toy pair (generated into a temporary cache) with `train()`, exactly as
`python run.py` does, for `--epochs` epochs with annealing off (so that no stopping rule cuts
the run short), checkpoints and validation included. At the end of every epoch it records:

- rss_mb: the process's resident memory (without forcing a garbage collection: what a long run
  really holds);
- peak_mb: the highest RSS so far (ru_maxrss);
- objects: the number of objects Python's garbage collector tracks (a leak of Python objects
  shows here long before it shows in RSS);
- seconds: the epoch's wall time.

The first `--warmup` epochs are set apart (allocator pools fill, loaders and the first
checkpoint are made); over the later ones it reports the growth of RSS and of the object count,
the least-squares slope per epoch, the trend (slope x measured span, which one noisy end point
cannot fake) and the noise (median absolute change from one epoch to the next). Growth "beyond
noise" means a trend of more than 3 x the noise and more than 1 MB. Figures are printed and,
with `--json`, written out.

    python bench/soak_train.py                          # fconv_toy, 12 epochs of 20k pairs
    python bench/soak_train.py --epochs 6 --train-pairs 4000 --tiny   # a quick look
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytorch_lightning as pl
import torch

from machine import machine, machine_line  # bench/, beside this script (on sys.path as a script)

if TYPE_CHECKING:
    from convseq.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
TINY = [  # the test suite's tiny model: a whole epoch takes well under a second
    "model.encoder_embed_dim=16",
    "model.decoder_embed_dim=16",
    "model.decoder_out_embed_dim=16",
    "model.encoder_layers=[[16,3]]",
    "model.decoder_layers=[[16,3]]",
]


class MemoryRecorder(pl.Callback):
    """Records RSS, peak RSS, tracked objects and wall time at the end of every training epoch.

    Runs after validation (Lightning validates inside the epoch, before its end hooks), so the
    figures include what validation holds on to.
    """

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.parameters = 0
        self._proc = psutil.Process()
        self._t = time.perf_counter()

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.parameters = sum(p.numel() for p in module.parameters())

    def on_train_epoch_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self._t = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.rows.append(
            {
                "epoch": trainer.current_epoch + 1,
                "rss_mb": self._proc.memory_info().rss / 2**20,
                "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "objects": len(gc.get_objects()),
                "seconds": time.perf_counter() - self._t,
                "updates": trainer.global_step,
            }
        )
        r = self.rows[-1]
        print(
            f"soak: epoch {r['epoch']:3d}  rss {r['rss_mb']:8.1f} MB  peak {r['peak_mb']:8.1f} MB"
            f"  objects {r['objects']:8d}  {r['seconds']:6.1f} s",
            flush=True,
        )


def compose(args: argparse.Namespace, cache: Path, out: Path) -> TrainConfig:
    """The typed config of the soak run (the real conf/ tree, as run.py hands it to train)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from convseq.cli.schema import register_configs
    from convseq.tasks.config import as_config

    register_configs()
    GlobalHydra.instance().clear()
    overrides = [
        f"paths.cache_dir={cache}",
        "data.generator=null",
        f"data.dir={cache / 'corpus'}",
        f"batching.max_tokens={args.max_tokens}",
        "anneal=none",  # no stopping rule: every epoch runs
        f"trainer.max_epochs={args.epochs}",
        "trainer.enable_progress_bar=false",
        "trainer.log_every_n_steps=50",
        *(TINY if args.tiny else []),
    ]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = hydra_compose(config_name="train", overrides=overrides)
    GlobalHydra.instance().clear()
    cfg.paths.output_dir = str(out)
    return as_config(cfg)


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (0 with fewer than two points)."""
    if len(xs) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def analyse(rows: list[dict[str, float]], warmup: int) -> dict[str, Any]:
    """Growth after the warm-up epochs, per-epoch slope, noise, and the verdict."""
    kept = rows[warmup:] if len(rows) > warmup + 1 else rows
    epochs = [r["epoch"] for r in kept]
    result: dict[str, Any] = {"measured_epochs": [int(e) for e in epochs]}
    for key in ("rss_mb", "objects"):
        ys = [float(r[key]) for r in kept]
        deltas = [abs(b - a) for a, b in zip(ys, ys[1:])]
        result[key] = {
            "first": ys[0],
            "last": ys[-1],
            "min": min(ys),
            "max": max(ys),
            "growth": ys[-1] - ys[0],
            "slope_per_epoch": slope(epochs, ys),
            "trend": slope(epochs, ys) * (epochs[-1] - epochs[0]),
            "noise": statistics.median(deltas) if deltas else 0.0,
        }
    rss = result["rss_mb"]
    result["rss_growth_beyond_noise"] = bool(rss["trend"] > 3 * rss["noise"] and rss["trend"] > 1.0)
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2, help="epochs left out of the analysis")
    parser.add_argument("--train-pairs", type=int, default=20000, help="toy training pairs")
    parser.add_argument("--max-tokens", type=int, default=1000)
    parser.add_argument("--tiny", action="store_true", help="the test suite's tiny model")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return parser.parse_args()


def soak(args: argparse.Namespace) -> tuple[TrainConfig, MemoryRecorder, float, float]:
    """The training run, recorded: (its config, the recorder, wall seconds, RSS after the test)."""
    from convseq.data.toy.corpus import write_toy_corpus
    from convseq.tasks.train import train

    with tempfile.TemporaryDirectory(prefix="convseq-soak-") as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "run"
        write_toy_corpus(cache / "corpus", seed=1, n_train=args.train_pairs)
        cfg = compose(args, cache, out)
        recorder = MemoryRecorder()
        t0 = time.perf_counter()
        train(cfg, callbacks=[recorder])
        wall = time.perf_counter() - t0
        final_rss = psutil.Process().memory_info().rss / 2**20
    return cfg, recorder, wall, final_rss


def print_report(result: dict[str, Any], args: argparse.Namespace) -> None:
    rows = result["epochs"]
    a = result["analysis"]
    rss, objs = a["rss_mb"], a["objects"]
    print(f"soak: {machine_line(result['machine'])}")
    print(
        f"soak: {len(rows)} epochs in {result['wall_seconds']:.0f} s ({result['model']}, "
        f"{args.train_pairs} pairs, {result['threads']} threads, load {result['load_average']})"
    )
    print(
        f"soak: RSS over epochs {a['measured_epochs'][0]}-{a['measured_epochs'][-1]}: "
        f"{rss['first']:.1f} -> {rss['last']:.1f} MB (growth {rss['growth']:+.1f} MB, "
        f"slope {rss['slope_per_epoch']:+.2f} MB/epoch, trend {rss['trend']:+.1f} MB, "
        f"noise {rss['noise']:.2f} MB, "
        f"range {rss['min']:.1f}-{rss['max']:.1f}); peak {rows[-1]['peak_mb']:.1f} MB"
    )
    print(
        f"soak: tracked objects {objs['first']:.0f} -> {objs['last']:.0f} "
        f"(growth {objs['growth']:+.0f}, slope {objs['slope_per_epoch']:+.1f}/epoch)"
    )
    print(f"soak: RSS growth beyond noise: {'YES' if a['rss_growth_beyond_noise'] else 'no'}")


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg, recorder, wall, final_rss = soak(args)
    result = {
        "machine": machine(),
        "model": "tiny" if args.tiny else cfg.model.arch,
        "parameters": recorder.parameters,
        "train_pairs": args.train_pairs,
        "max_tokens": args.max_tokens,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "wall_seconds": wall,
        "rss_after_test_mb": final_rss,
        "epochs": recorder.rows,
        "analysis": analyse(recorder.rows, args.warmup),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }
    print_report(result, args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
