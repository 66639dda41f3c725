"""Benchmark: padding waste of token-budget vs fixed-sentence batches, and loader throughput.

On Multi30k (../shared/data/multi30k, preprocessed with conf/data/multi30k.yaml: joint BPE 8000):

1. Share of real (non-pad) tokens in the padded source + target batch tensors of the train split,
   for token-budget batches (`batching=tokens`, fairseq's length order and the optional "snake"
   order) and for fixed-sentence batches whose size is matched to the same mean batch size
   (`batching=sentences` + `match_max_tokens`), sorted by length, plus fixed-sentence batches over
   a random order (a plain `DataLoader(batch_size=...)`) for reference. Also the spread of padded
   tokens per batch, which a token budget bounds.
2. Loader throughput in real tokens/s through the real DataLoader + collate, one train epoch.

Every figure is the median of `--repeats` runs (padding shares over seeds 1..repeats).

    python bench/bench_batching.py                       # max_tokens 4000, as conf/batching/tokens.yaml
    python bench/bench_batching.py --max-tokens 2000 --repeats 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from convseq.cli.schema import default_cache_dir
from convseq.data.batching import TokenBatchSampler, match_max_sentences
from convseq.data.datamodule import TranslationDataModule
from machine import machine_line  # bench/, beside this script (on sys.path as a script)

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def padding_stats(batches, src: np.ndarray, tgt: np.ndarray) -> dict[str, float]:
    """Real-token share of the padded (B, S) + (B, T) tensors, and padded tokens per batch."""
    real_s = real_t = pad_s = pad_t = 0
    cost = []
    for b in batches:
        s, t = src[b], tgt[b]
        real_s, real_t = real_s + int(s.sum()), real_t + int(t.sum())
        pad_s, pad_t = pad_s + len(b) * int(s.max()), pad_t + len(b) * int(t.max())
        cost.append(len(b) * int(max(s.max(), t.max())))  # what max_tokens bounds
    cost = np.array(cost)
    return {
        "real": (real_s + real_t) / (pad_s + pad_t),
        "real_src": real_s / pad_s,
        "real_tgt": real_t / pad_t,
        "bsz": float(np.mean([len(b) for b in batches])),
        "cost_mean": float(cost.mean()),
        "cost_max": float(cost.max()),
        "cost_cv": float(cost.std() / cost.mean()),
        "n": len(batches),
    }


def loader_epoch(dm: TranslationDataModule) -> tuple[float, int, int]:
    """(seconds, real source + target tokens, target tokens) of one train epoch through the loader."""
    loader = dm.train_dataloader()
    n_all = n_tgt = 0
    t0 = time.perf_counter()
    for batch in loader:
        n_tgt += batch["ntokens"]
        n_all += batch["ntokens"] + int(batch["net_input"]["src_lengths"].sum())
    return time.perf_counter() - t0, n_all, n_tgt


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--cache-dir", default=os.environ.get("CONVSEQ_CACHE") or default_cache_dir())
    return ap.parse_args()


def data_settings(max_tokens: int) -> tuple[dict, dict]:
    """conf/data/multi30k.yaml on ../shared/data and conf/batching/tokens.yaml at `max_tokens`."""
    data = OmegaConf.load(ROOT / "conf" / "data" / "multi30k.yaml")
    data.dir = str(CORPUS)
    data = OmegaConf.to_container(data, resolve=True)
    tokens = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "batching" / "tokens.yaml"))
    tokens.pop("defaults", None)  # Hydra's lookup of batch_sizes' own sizes, not a batching key
    tokens["max_tokens"] = max_tokens
    return data, tokens


def train_split(data: dict, tokens: dict, cache_dir: str):
    """The train split's dataset, its data-bin built first if need be (both reported)."""
    dm = TranslationDataModule(data, tokens, cache_dir)
    t0 = time.perf_counter()
    dm.prepare_data()
    dm.setup("fit")
    print(f"data-bin ready in {time.perf_counter() - t0:.1f} s: {dm.databin.path}")
    train = dm.dataset("train")
    src, tgt = train.src_sizes, train.tgt_sizes
    n = len(train)
    print(f"train: {n} pairs, mean length {src.mean():.1f} (src) / {tgt.mean():.1f} (tgt) tokens")
    return train


def padding_runs(
    src: np.ndarray, tgt: np.ndarray, max_tokens: int, mult: int, ms: int, repeats: int
) -> tuple[dict[str, list[dict]], list[float]]:
    """Each batching's padding figures at seeds 1..repeats, and the ms to build the token batches."""
    n = len(src)
    rows: dict[str, list[dict]] = {
        "tokens": [],
        "tokens, snake order": [],
        "sentences (sorted)": [],
        "sentences (random)": [],
    }
    build_ms = []
    for seed in range(1, repeats + 1):
        t0 = time.perf_counter()
        tok = TokenBatchSampler(
            src, tgt, max_tokens=max_tokens, required_batch_size_multiple=mult, seed=seed
        )
        build_ms.append((time.perf_counter() - t0) * 1e3)
        snake = TokenBatchSampler(
            src,
            tgt,
            max_tokens=max_tokens,
            order="snake",
            required_batch_size_multiple=mult,
            seed=seed,
        )
        sent = TokenBatchSampler(src, tgt, max_sentences=ms, seed=seed)
        perm = np.random.RandomState(seed).permutation(n)
        rows["tokens"].append(padding_stats(tok.batches, src, tgt))
        rows["tokens, snake order"].append(padding_stats(snake.batches, src, tgt))
        rows["sentences (sorted)"].append(padding_stats(sent.batches, src, tgt))
        rows["sentences (random)"].append(
            padding_stats(np.array_split(perm, -(-n // ms)), src, tgt)
        )
    return rows, build_ms


def print_padding(
    rows: dict[str, list[dict]], build_ms: list[float], max_tokens: int, mult: int, ms: int
) -> None:
    """The padding table: each batching's medians over the seeds."""
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in rows.items()}
    print(
        f"\nmax_tokens={max_tokens} (multiple {mult}); matched max_sentences={ms}; "
        f"frozen batch list built in {statistics.median(build_ms):.0f} ms"
    )
    print("real tokens = non-pad share of the padded source + target tensors (src / tgt apart);")
    print("cost = batch size x longest pair, the padded size max_tokens bounds (mean, max, cv)")
    print(
        f"{'batching':<20} {'batches':>7} {'mean bsz':>8} {'real':>6} {'src':>6} {'tgt':>6} "
        f"{'cost':>6} {'max':>6} {'cv':>5}"
    )
    for name, m in med.items():
        print(
            f"{name:<20} {m['n']:>7.0f} {m['bsz']:>8.1f} {100 * m['real']:>5.1f}% "
            f"{100 * m['real_src']:>5.1f}% {100 * m['real_tgt']:>5.1f}% "
            f"{m['cost_mean']:>6.0f} {m['cost_max']:>6.0f} {m['cost_cv']:>5.2f}"
        )


def loader_throughput(data: dict, tokens: dict, args: argparse.Namespace) -> None:
    """One train epoch through the loader at each worker count, timed; a row each."""
    print(f"\nloader throughput (one train epoch, median of {args.repeats}):")
    print(f"{'workers':>7} {'seconds':>8} {'src+tgt tok/s':>14} {'tgt tok/s':>10}")
    for workers in args.workers:
        wdata = {**data, "num_workers": workers}
        wdm = TranslationDataModule(wdata, tokens, args.cache_dir)
        wdm.setup("fit")
        wdm.train_dataloader()  # build the frozen batches outside the timing
        runs = []
        for _ in range(args.repeats):
            runs.append(loader_epoch(wdm))
        sec = statistics.median(r[0] for r in runs)
        print(f"{workers:>7} {sec:>8.3f} {runs[0][1] / sec:>14,.0f} {runs[0][2] / sec:>10,.0f}")


def main() -> int:
    args = parse_args()
    if not (CORPUS / "train.de").is_file():
        print(f"skipped: Multi30k not found at {CORPUS}")
        return 0
    print(machine_line())
    data, tokens = data_settings(args.max_tokens)
    train = train_split(data, tokens, args.cache_dir)
    src, tgt = train.src_sizes, train.tgt_sizes

    # 1. padding ------------------------------------------------------------------------------
    mult = tokens["required_batch_size_multiple"]
    ms = match_max_sentences(src, tgt, args.max_tokens, required_batch_size_multiple=1)
    rows, build_ms = padding_runs(src, tgt, args.max_tokens, mult, ms, args.repeats)
    print_padding(rows, build_ms, args.max_tokens, mult, ms)

    # 2. throughput ---------------------------------------------------------------------------
    loader_throughput(data, tokens, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
