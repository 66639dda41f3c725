"""Benchmark: training throughput of convseq's Lightning loop against a bare PyTorch loop.

Both loops train the same model (same seed, so the same initial weights) on the same batches
(the first batches of epoch 1 of the token-budget sampler) with the same optimiser, gradient
normalisation (summed loss / target tokens) and clipping. The Lightning loop is the one `train()`
runs: ConvSeqModule with its per-update figures and logging, convseq's callbacks and its CSV
logger (checkpointing and validation off: they happen once an epoch, outside the timed window).

Each repeat runs each loop in a fresh process (alternating which goes first, so that drifting
load on a shared machine hits both alike); every figure is the median over the repeats:

- wps: target tokens per second over `--updates` timed updates after `--warmup` untimed ones,
  and the Lightning loop's overhead, time(Lightning) / time(bare) - 1, from wall time and from
  the process's CPU time (on a machine shared with other work, wall time swings between repeats
  by more than the overhead; CPU time of a `--threads 1` run is the work done, whatever the load);
- achieved GFLOP/s of the forward + backward (matmul-class operations counted by torch's
  FlopCounterMode, conv_tbc and its in-place GEMMs included; optimiser and element-wise work
  not counted), per wall second and per CPU second, against this machine's fp32 matmul peak
  (best of several 2048^3 matmuls on the same threads, before and after the loops);
- peak resident memory (RSS) of each process.

    python bench/bench_train.py                        # fconv_iwslt_de_en on Multi30k, 4000 tokens
    python bench/bench_train.py --threads 1 --max-tokens 2000 --updates 8 --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from machine import machine, machine_line  # bench/, beside this script (on sys.path as a script)

if TYPE_CHECKING:
    from convseq.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
DATA_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data"
VARIANTS = ("bare", "lightning")


# -- configuration and data ---------------------------------------------------------------------
def compose_cfg(args: argparse.Namespace, output_dir: str) -> TrainConfig:
    """The typed config of a Multi30k run of `args.model`, as run.py would hand it to train."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from convseq.cli.schema import register_configs
    from convseq.tasks.config import as_config

    register_configs()
    GlobalHydra.instance().clear()
    overrides = [
        "data=multi30k",
        f"paths.data_root={DATA_ROOT}",
        f"paths.cache_dir={args.cache_dir}",
        f"model={args.model}",
        f"batching.max_tokens={args.max_tokens}",
        "trainer.enable_progress_bar=false",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    GlobalHydra.instance().clear()
    cfg.paths.output_dir = output_dir
    return as_config(cfg)


def build(cfg: TrainConfig):
    """(module, datamodule) exactly as train() builds them, seeded."""
    import pytorch_lightning as pl

    from convseq.data.databin import DataBin
    from convseq.data.preprocess import prepare_databin
    from convseq.training.build import build_datamodule, build_module

    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    databin = DataBin(prepare_databin(cfg.data, cfg.paths.cache_dir, progress=False))
    module = build_module(cfg, databin)
    dm = build_datamodule(cfg, module)
    return module, dm


def first_batches(dm, n: int) -> list[dict]:
    """The first `n` train batches of epoch 1 (what both loops train on)."""
    dm.setup("fit")
    loader = dm.train_dataloader()
    dm.batch_sampler("train").set_epoch(0)
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            return out
    raise SystemExit(f"only {len(out)} train batches; lower --warmup/--updates")


# -- the two loops (each in its own process) ----------------------------------------------------
def run_bare(cfg: TrainConfig, warmup: int, updates: int) -> dict[str, float]:
    """A plain PyTorch loop: forward, summed loss, backward, / tokens, clip, step."""
    from convseq.optim.build import build_optimizer

    module, dm = build(cfg)
    model, criterion = module.model, module.criterion
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, cfg.optim)
    clip = float(cfg.optim.clip_norm or 0.0)
    model.train()
    dm.setup("fit")
    loader = dm.train_dataloader()
    dm.batch_sampler("train").set_epoch(0)
    tokens, losses, t0, c0 = 0, [], 0.0, 0.0
    for i, batch in enumerate(loader):
        if i == warmup + updates:
            break
        if i == warmup:
            t0, c0 = time.perf_counter(), time.process_time()
        optimizer.zero_grad(set_to_none=True)
        logits, _ = model(**batch["net_input"])  # (B, T, V)
        out = criterion(logits, batch["target"])
        out.loss.backward()
        size = criterion.sample_size(out)
        torch._foreach_mul_([p.grad for p in params if p.grad is not None], 1.0 / float(size))
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        if i >= warmup:
            tokens += int(batch["ntokens"])
            losses.append(out.loss.detach())
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "tokens": tokens,
        "loss_sum": float(sum(losses)),
    }


def run_lightning(cfg: TrainConfig, warmup: int, updates: int) -> dict[str, float]:
    """convseq's own Trainer, module and callbacks, timed over the same window."""
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint

    from convseq.training.build import build_callbacks, build_trainer

    class Window(pl.Callback):
        def __init__(self) -> None:
            self.t0 = self.t1 = self.c0 = self.c1 = 0.0
            self.tokens, self.losses = 0, []

        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            if batch_idx == warmup:
                self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            if batch_idx >= warmup:
                self.tokens += int(batch["ntokens"])
                self.losses.append(outputs["loss"].detach())
            if batch_idx == warmup + updates - 1:
                self.t1, self.c1 = time.perf_counter(), time.process_time()

    module, dm = build(cfg)
    output_dir = Path(cfg.paths.output_dir)
    trainer_cfg = dataclasses.replace(
        cfg.trainer,
        max_epochs=1,
        limit_train_batches=warmup + updates,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    cfg = dataclasses.replace(cfg, trainer=trainer_cfg)
    cbs = build_callbacks(cfg, output_dir / "checkpoints")
    cbs.pop("best")
    window = Window()
    trainer = build_trainer(cfg, [*cbs.values(), window], output_dir)
    # no checkpointing (once an epoch, outside the timed window): Lightning's default
    # ModelCheckpoint goes too (trainer.enable_checkpointing is no key of convseq's config)
    trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, ModelCheckpoint)]
    trainer.fit(module, datamodule=dm)
    return {
        "seconds": window.t1 - window.t0,
        "cpu_seconds": window.c1 - window.c0,
        "tokens": window.tokens,
        "loss_sum": float(sum(window.losses)),
    }


def child(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="convseq-bench-") as tmp:
        cfg = compose_cfg(args, tmp)
        fn = run_bare if args.child == "bare" else run_lightning
        result = fn(cfg, args.warmup, args.updates)
    result["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB
    Path(args.result).write_text(json.dumps(result))


# -- measurements in the parent -----------------------------------------------------------------
def matmul_peak(threads: int, n: int = 2048, repeats: int = 7) -> float:
    """Best GFLOP/s of an n x n x n fp32 matmul on `threads` threads.

    The best of the repeats, not their median: a peak, and on a shared machine every other
    process can only lower a measurement.
    """
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(2):
        a @ b  # warm-up: thread pool, caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / min(times) / 1e9


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def count_flops(cfg: TrainConfig, warmup: int, updates: int) -> float:
    """FLOPs of forward + backward over the timed batches (matmul-class operations)."""
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten

    def conv_tbc(x_shape, w_shape, b_shape, pad, out_shape=None, **kwargs) -> int:
        # out[t] = sum over k taps of x[t + j] @ w[j]: 2 * T_out * B * C_out * k * C_in
        return 2 * _prod(out_shape) * int(w_shape[0]) * int(w_shape[1])

    def addmm_(self_shape, m1_shape, m2_shape, *rest, out_shape=None, **kwargs) -> int:
        # conv_tbc's backward runs as in-place GEMMs, which the default table does not list
        return 2 * int(m1_shape[0]) * int(m1_shape[1]) * int(m2_shape[1])

    module, dm = build(cfg)
    batches = first_batches(dm, warmup + updates)[warmup:]
    module.model.train()
    counter = FlopCounterMode(
        display=False, custom_mapping={aten.conv_tbc: conv_tbc, aten.addmm_: addmm_}
    )
    with counter:
        for batch in batches:
            logits, _ = module.model(**batch["net_input"])  # (B, T, V)
            module.criterion(logits, batch["target"]).loss.backward()
            module.model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def cache_dir(given: str | None) -> str:
    """The data-bin cache a run.py run would use: `given`, else $CONVSEQ_CACHE, else the default."""
    from convseq.cli.schema import default_cache_dir

    return given or os.environ.get("CONVSEQ_CACHE") or default_cache_dir()


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="fconv_iwslt_de_en")
    ap.add_argument("--max-tokens", type=int, default=4000)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--updates", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.cache_dir = cache_dir(args.cache_dir)
    return args


def prepare(args: argparse.Namespace) -> float:
    """Build the data-bin once (outside the children's timing); the timed window's FLOPs."""
    with tempfile.TemporaryDirectory(prefix="convseq-bench-") as tmp:
        cfg = compose_cfg(args, tmp)
        from convseq.data.preprocess import prepare_databin

        t0 = time.perf_counter()
        databin = prepare_databin(cfg.data, args.cache_dir, progress=False)
        print(f"data-bin: {databin} ({time.perf_counter() - t0:.1f} s)")
        return count_flops(cfg, args.warmup, args.updates)


def run_child(variant: str, result: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One loop in a fresh process; its figures."""
    cmd = [sys.executable, __file__, "--child", variant, "--result", str(result)]
    cmd += ["--model", args.model, "--max-tokens", str(args.max_tokens)]
    cmd += ["--warmup", str(args.warmup), "--updates", str(args.updates)]
    cmd += ["--threads", str(args.threads), "--cache-dir", args.cache_dir]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return json.loads(result.read_text())


def run_repeats(args: argparse.Namespace) -> dict[str, list[dict]]:
    """Each loop `args.repeats` times, alternating which goes first; every run printed."""
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="convseq-bench-") as tmp:
        for r in range(args.repeats):
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                res = run_child(variant, Path(tmp) / f"{variant}{r}.json", args)
                runs[variant].append(res)
                print(
                    f"  repeat {r + 1} {variant:9s}: {res['tokens'] / res['seconds']:8.0f} wps, "
                    f"{res['seconds']:.2f} s wall, {res['cpu_seconds']:.2f} s CPU, "
                    f"loss sum {res['loss_sum']:.2f}, "
                    f"RSS {res['max_rss_mib']:.0f} MiB",
                    flush=True,
                )
    return runs


def loop_figures(
    runs: dict[str, list[dict]], flops: float, peak: float, updates: int
) -> dict[str, dict]:
    """Each loop's medians (speed, FLOP rate, memory), printed as a table."""
    figures: dict[str, dict] = {}
    head = (
        f"{'loop':10s} {'wps':>7s} {'s/update':>9s} {'CPU s/upd':>10s} {'GFLOP/s':>8s} "
        f"{'of peak':>8s} {'GFLOP/CPU s':>12s} {'of peak':>8s} {'RSS MiB':>8s}"
    )
    print("\n" + head)
    for v in VARIANTS:
        sec = statistics.median(r["seconds"] for r in runs[v])
        cpu = statistics.median(r["cpu_seconds"] for r in runs[v])
        figures[v] = {
            "wps": statistics.median(r["tokens"] / r["seconds"] for r in runs[v]),
            "seconds_per_update": sec / updates,
            "cpu_seconds_per_update": cpu / updates,
            "gflops": flops / sec / 1e9,
            "gflops_cpu": flops / cpu / 1e9,
            "rss_mib": statistics.median(r["max_rss_mib"] for r in runs[v]),
        }
        f = figures[v]
        print(
            f"{v:10s} {f['wps']:7.0f} {f['seconds_per_update']:9.3f} {f['cpu_seconds_per_update']:10.3f} "
            f"{f['gflops']:8.1f} {f['gflops'] / peak:8.1%} {f['gflops_cpu']:12.1f} "
            f"{f['gflops_cpu'] / peak:8.1%} {f['rss_mib']:8.0f}"
        )
    return figures


def lightning_overhead(
    runs: dict[str, list[dict]], figures: dict[str, Any], updates: int
) -> dict[str, float]:
    """The Lightning loop's overhead over the bare loop, printed."""
    # Overhead from wall time and from process CPU time (which other processes' load moves
    # less: with --threads 1 it is close to the work done), each as the ratio of the medians and
    # as the median of per-repeat ratios (the two loops ran back to back, so slow drifts in the
    # machine's load cancel).
    wall = figures["bare"]["wps"] / figures["lightning"]["wps"] - 1
    paired = statistics.median(
        lt["seconds"] / b["seconds"] - 1 for b, lt in zip(runs["bare"], runs["lightning"])
    )
    cpu = (
        figures["lightning"]["cpu_seconds_per_update"] / figures["bare"]["cpu_seconds_per_update"]
        - 1
    )
    paired_cpu = statistics.median(
        lt["cpu_seconds"] / b["cpu_seconds"] - 1 for b, lt in zip(runs["bare"], runs["lightning"])
    )
    extra_ms = statistics.median(
        (lt["cpu_seconds"] - b["cpu_seconds"]) / updates * 1e3
        for b, lt in zip(runs["bare"], runs["lightning"])
    )
    print(
        f"Lightning loop overhead (goal <= 5%): wall time {wall:+.1%} (medians), {paired:+.1%} "
        f"(median of paired repeats); CPU time {cpu:+.1%} (medians), {paired_cpu:+.1%} "
        f"(paired), {extra_ms:+.1f} ms per update (paired)"
    )
    return {
        "wall": wall,
        "paired_wall": paired,
        "cpu": cpu,
        "paired_cpu": paired_cpu,
        "cpu_ms_per_update": extra_ms,
    }


def main() -> int:
    args = parse_args()
    if args.child:
        child(args)
        return 0
    if not (DATA_ROOT / "multi30k" / "train.de").is_file():
        print(f"skipped: Multi30k not found at {DATA_ROOT / 'multi30k'}")
        return 0
    torch.set_num_threads(args.threads)
    info = machine()
    print(machine_line(info))
    flops = prepare(args)
    peak_before = matmul_peak(args.threads)
    print(
        f"model {args.model}, max_tokens {args.max_tokens}, {args.warmup} warm-up + "
        f"{args.updates} timed updates, {args.repeats} repeats, {args.threads} threads"
    )
    print(f"forward+backward: {flops / 1e9 / args.updates:.1f} GFLOP per update")

    runs = run_repeats(args)
    peak = max(peak_before, matmul_peak(args.threads))
    print(f"fp32 matmul peak (2048^3, {args.threads} threads): {peak:.1f} GFLOP/s")
    tokens = {v: {r["tokens"] for r in runs[v]} for v in VARIANTS}
    if len(tokens["bare"] | tokens["lightning"]) != 1:
        print(f"WARNING: the loops saw different batches (target tokens {tokens})")

    figures: dict[str, Any] = {"machine": info, "peak_gflops": peak}
    figures["gflop_per_update"] = flops / 1e9 / args.updates
    figures.update(loop_figures(runs, flops, peak, args.updates))
    figures["lightning_overhead"] = lightning_overhead(runs, figures, args.updates)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
