"""Soak benchmark: resident memory (RSS) of generation that runs for a long time, batch after batch.

Translates a test split again and again for `--minutes`, through `trainer.predict` and the
`GenerationModule` exactly as `python run.py task=generate` does (one Trainer, one `predict` per
pass), and records after every batch:

- rss_mib: the process's resident memory (VmRSS of /proc/self/status; no garbage collection
  forced: what a long job really holds);
- peak_mib: the highest RSS so far (ru_maxrss);
- t: seconds since the first batch began.

After every pass it records the pass's time, sentences/s and the number of objects Python's
garbage collector tracks. The summary gives RSS at the start (model loaded, before the first
batch), after the first pass, the maximum, the least-squares slope in MiB per hour over the last
3/4 of the batches (the first quarter is warm-up: allocator pools and caches fill), the trend
(slope x fitted span) against the noise (median absolute change of the per-pass RSS), and the
median sentences/s of the passes. Growth "beyond noise" means a trend of more than 3 x the noise
and more than 1 MiB. Into `--out` (default outputs/soak_generate) go `rss_per_batch.png`, RSS per
batch over time with the fitted line, and `soak_generate.json`, every figure.

Without `--ckpt` a toy model is trained first (a few seconds with `--tiny`, about a minute for
fconv_toy) on a generated toy pair, and its test split is translated.

    python bench/soak_generate.py                                  # fconv_toy, 20 minutes
    python bench/soak_generate.py --minutes 1 --tiny --threads 1   # a quick look
    python bench/soak_generate.py --ckpt run/checkpoints/best.ckpt --databin cache/databin/X
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
import warnings
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from machine import machine, machine_line  # bench/ is on sys.path when this runs as a script
from soak_train import TINY, slope

ROOT = Path(__file__).resolve().parents[1]


def rss_mib() -> float:
    """Resident memory of this process in MiB (VmRSS; ru_maxrss where /proc is absent)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024  # kB -> MiB
    except OSError:
        pass
    return peak_mib()


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


class BatchRecorder(pl.Callback):
    """RSS after every predict batch, and each pass's time, size and tracked objects."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.batches: list[dict[str, float]] = []
        self.passes: list[dict[str, float]] = []
        self._pass_start = t0
        self._sentences = 0

    def on_predict_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self._pass_start = time.perf_counter()
        self._sentences = 0

    def on_predict_batch_end(
        self, trainer: pl.Trainer, module: Any, outputs: Any, batch: Any, batch_idx: int, *_: Any
    ) -> None:
        self._sentences += int(batch["id"].numel())  # predict_step keeps its records
        self.batches.append(
            {
                "pass": len(self.passes) + 1,
                "batch": batch_idx,
                "t": time.perf_counter() - self.t0,
                "rss_mib": rss_mib(),
                "peak_mib": peak_mib(),
            }
        )

    def on_predict_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        seconds = time.perf_counter() - self._pass_start
        self.passes.append(
            {
                "pass": len(self.passes) + 1,
                "seconds": seconds,
                "sentences": self._sentences,
                "sentences_per_s": self._sentences / max(seconds, 1e-9),
                "rss_mib": rss_mib(),
                "objects": len(gc.get_objects()),
            }
        )
        p = self.passes[-1]
        print(
            f"soak: pass {p['pass']:4d}  {p['seconds']:6.1f} s  {p['sentences_per_s']:7.1f} "
            f"sentences/s  rss {p['rss_mib']:7.1f} MiB  peak {peak_mib():7.1f} MiB  "
            f"objects {p['objects']}",
            flush=True,
        )


def train_toy(args: argparse.Namespace, tmp: Path) -> tuple[Path, Path]:
    """Train the toy model briefly; returns (best.ckpt, its data-bin folder)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from convseq.cli.schema import register_configs
    from convseq.data.preprocess import prepare_databin
    from convseq.data.toy.corpus import write_toy_corpus
    from convseq.tasks.config import as_config
    from convseq.tasks.train import train

    cache, out = tmp / "cache", tmp / "run"
    write_toy_corpus(cache / "corpus", seed=1, n_train=args.train_pairs, n_test=args.test_pairs)
    register_configs()
    GlobalHydra.instance().clear()
    overrides = [
        f"paths.cache_dir={cache}",
        "data.generator=null",
        f"data.dir={cache / 'corpus'}",
        f"trainer.max_epochs={args.train_epochs}",
        "trainer.enable_progress_bar=false",
        "gen.test_bleu=false",
        *(TINY if args.tiny else []),
    ]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    GlobalHydra.instance().clear()
    cfg.paths.output_dir = str(out)
    cfg = as_config(cfg)
    train(cfg)
    databin = prepare_databin(cfg.data, str(cache), progress=False)
    return out / "checkpoints" / "best.ckpt", Path(databin)


def analyse(batches: list[dict[str, float]], passes: list[dict[str, float]]) -> dict[str, Any]:
    """Start / first-pass / max RSS, the slope over the last 3/4 of the batches, throughput."""
    kept = batches[len(batches) // 4 :] if len(batches) >= 8 else batches
    ts = [b["t"] for b in kept]
    ys = [b["rss_mib"] for b in kept]
    per_hour = slope(ts, ys) * 3600
    span = ts[-1] - ts[0]
    first_kept_pass = kept[0]["pass"]
    pass_rss = [p["rss_mib"] for p in passes if p["pass"] >= first_kept_pass]
    deltas = [abs(b - a) for a, b in zip(pass_rss, pass_rss[1:])]
    noise = statistics.median(deltas) if deltas else 0.0
    trend = per_hour * span / 3600
    speeds = [p["sentences_per_s"] for p in passes]
    objects = [p["objects"] for p in passes]
    return {
        "batches": len(batches),
        "passes": len(passes),
        "fitted_from_s": ts[0],
        "fitted_span_s": span,
        "rss_min_fitted_mib": min(ys),
        "rss_max_fitted_mib": max(ys),
        "slope_mib_per_hour": per_hour,
        "trend_mib": trend,
        "noise_mib": noise,
        "rss_growth_beyond_noise": bool(trend > 3 * noise and trend > 1.0),
        "sentences_per_s_median": statistics.median(speeds) if speeds else 0.0,
        "sentences_per_s_min": min(speeds, default=0.0),
        "sentences_per_s_max": max(speeds, default=0.0),
        "objects_first_pass": objects[0] if objects else 0,
        "objects_last_pass": objects[-1] if objects else 0,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """RSS per batch against minutes, pass boundaries dotted, the fitted line over the last 3/4."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    batches, a = result["batches"], result["analysis"]
    minutes = [b["t"] / 60 for b in batches]
    fig = Figure(figsize=(9, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(minutes, [b["rss_mib"] for b in batches], lw=0.8, label="RSS after each batch")
    ax.axhline(result["rss_start_mib"], color="grey", ls=":", lw=0.8, label="RSS at start")
    # the least-squares line through the fitted window (drawn from its own mean point)
    kept = [b for b in batches if b["t"] >= a["fitted_from_s"]]
    t_mean = statistics.fmean(b["t"] for b in kept)
    y_mean = statistics.fmean(b["rss_mib"] for b in kept)
    x0, x1 = kept[0]["t"], kept[-1]["t"]
    per_s = a["slope_mib_per_hour"] / 3600
    ax.plot(
        [x0 / 60, x1 / 60],
        [y_mean + per_s * (x0 - t_mean), y_mean + per_s * (x1 - t_mean)],
        color="red",
        lw=1.2,
        label=f"fit over the last 3/4: {a['slope_mib_per_hour']:+.1f} MiB/h",
    )
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title(
        f"generation soak: {result['model']}, {a['passes']} passes, {a['batches']} batches, "
        f"median {a['sentences_per_s_median']:.1f} sentences/s",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.savefig(path, dpi=110)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="how long to keep translating")
    parser.add_argument("--max-passes", type=int, default=0, help="stop after N passes (0: none)")
    parser.add_argument("--ckpt", type=Path, default=None, help="a checkpoint (default: train toy)")
    parser.add_argument("--databin", type=Path, default=None, help="the data-bin of --ckpt's split")
    parser.add_argument("--split", default="test")
    parser.add_argument("--tiny", action="store_true", help="toy: the test suite's tiny model")
    parser.add_argument("--train-epochs", type=int, default=2, help="toy: training epochs")
    parser.add_argument("--train-pairs", type=int, default=4000, help="toy: training pairs")
    parser.add_argument("--test-pairs", type=int, default=1000, help="toy: test pairs")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--max-len-b", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=4000, help="gen.max_tokens")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument(
        "--out", type=Path, default=Path("outputs/soak_generate"), help="folder of the PNG and JSON"
    )
    args = parser.parse_args()
    if args.ckpt is not None and args.databin is None:
        parser.error("--ckpt needs --databin (the data-bin holding the split to translate)")
    return args


def generation(args: argparse.Namespace, tmp: Path) -> tuple[Any, Any, Any]:
    """(translator, GenerationModule over the split's batches, the data-bin), as
    `task=generate` builds them; a toy model is trained first without --ckpt."""
    from convseq.data.databin import DataBin
    from convseq.inference.generation import GenerationModule, load_translator, split_batches
    from convseq.inference.options import GenConfig

    ckpt, databin_dir = args.ckpt, args.databin
    if ckpt is None:
        ckpt, databin_dir = train_toy(args, tmp)
    databin = DataBin(databin_dir)
    gen = GenConfig(beam=args.beam, max_len_b=args.max_len_b, max_tokens=args.max_tokens)
    translator = load_translator(str(ckpt), gen, databin=databin)
    module = GenerationModule(
        translator, translator.options, split_batches(translator, databin, args.split, gen)
    )
    return translator, module, databin


def soak(module, sentences: int, args: argparse.Namespace) -> tuple[BatchRecorder, float, float]:
    """Pass after pass over the split until the deadline: (the recorder, RSS at start, wall s)."""
    from convseq.common.config import DeviceConfig
    from convseq.inference.generation import predict_trainer

    trainer = predict_trainer(DeviceConfig(accelerator="cpu"))
    gc.collect()
    start_rss = rss_mib()  # model and data loaded, nothing translated yet
    t0 = time.perf_counter()
    recorder = BatchRecorder(t0)
    trainer.callbacks.append(recorder)
    deadline = t0 + args.minutes * 60
    while time.perf_counter() < deadline:
        trainer.predict(module, return_predictions=False)  # records gathered in input order
        assert len(module.records) == sentences, "a sentence went missing"
        if args.max_passes and len(recorder.passes) >= args.max_passes:
            break
    return recorder, start_rss, time.perf_counter() - t0


def summary(
    args: argparse.Namespace, translator, recorder: BatchRecorder, start_rss: float, wall: float
) -> dict[str, Any]:
    """Every figure of the run, as soak_generate.json holds them."""
    batches, passes = recorder.batches, recorder.passes
    first_pass_rss = next(b["rss_mib"] for b in reversed(batches) if b["pass"] == 1)
    return {
        "machine": machine(),
        "model": str(args.ckpt) if args.ckpt else ("toy, tiny model" if args.tiny else "fconv_toy"),
        "parameters": sum(p.numel() for p in translator.models[0].parameters()),
        "split": args.split,
        "sentences_per_pass": passes[0]["sentences"],
        "options": translator.options.search_kwargs(),
        "max_tokens": args.max_tokens,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "minutes": args.minutes,
        "wall_seconds": wall,
        "rss_start_mib": start_rss,
        "rss_after_first_pass_mib": first_pass_rss,
        "rss_max_mib": max(b["rss_mib"] for b in batches),
        "peak_mib": peak_mib(),
        "analysis": analyse(batches, passes),
        "passes": passes,
        "batches": batches,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }


def print_report(result: dict[str, Any], args: argparse.Namespace) -> None:
    a = result["analysis"]
    print(f"soak: {machine_line(result['machine'])}")
    print(
        f"soak: {a['passes']} passes, {a['batches']} batches in {result['wall_seconds'] / 60:.1f} "
        f"min ({result['model']}, {result['sentences_per_pass']} sentences a pass, beam "
        f"{args.beam}, {result['threads']} threads, load {result['load_average']})"
    )
    print(
        f"soak: RSS start {result['rss_start_mib']:.1f} MiB, after pass 1 "
        f"{result['rss_after_first_pass_mib']:.1f} MiB, "
        f"max {result['rss_max_mib']:.1f} MiB (peak {result['peak_mib']:.1f} MiB)"
    )
    print(
        f"soak: last 3/4 ({a['fitted_span_s'] / 60:.1f} min from {a['fitted_from_s'] / 60:.1f}): "
        f"slope {a['slope_mib_per_hour']:+.2f} MiB/h, trend {a['trend_mib']:+.2f} MiB, "
        f"noise {a['noise_mib']:.2f} MiB, range {a['rss_min_fitted_mib']:.1f}-"
        f"{a['rss_max_fitted_mib']:.1f} MiB"
    )
    print(
        f"soak: sentences/s per pass: median {a['sentences_per_s_median']:.1f} "
        f"(min {a['sentences_per_s_min']:.1f}, max {a['sentences_per_s_max']:.1f}); tracked "
        f"objects {a['objects_first_pass']} -> {a['objects_last_pass']}"
    )
    print(f"soak: RSS growth beyond noise: {'YES' if a['rss_growth_beyond_noise'] else 'no'}")


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message="You are using a custom batch sampler")
    with tempfile.TemporaryDirectory(prefix="convseq-soakgen-") as tmp:
        translator, module, databin = generation(args, Path(tmp))
        sentences = len(databin.text(args.split, "src"))
        recorder, start_rss, wall = soak(module, sentences, args)
    result = summary(args, translator, recorder, start_rss, wall)
    print_report(result, args)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(result, args.out / "rss_per_batch.png")
    (args.out / "soak_generate.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"soak: {args.out / 'rss_per_batch.png'} and {args.out / 'soak_generate.json'} written")


if __name__ == "__main__":
    main()
