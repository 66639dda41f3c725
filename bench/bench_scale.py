"""Benchmark: how preprocessing, the batch plan, the loader and start-up scale with corpus size.

For each size N (`--sizes 100k,1M,3M`) a train split of N sentence pairs is made, then:

1. preprocessing (`prepare_databin`, a fresh build) in its own subprocess, with 1 and 2 encoding
   workers when the data config has `data.workers`: wall time of the call (interpreter start and
   imports excluded) and peak memory: the largest single process (the child's VmHWM, or its
   children's RUSAGE_CHILDREN ru_maxrss, read inside the child), and the peak of the summed RSS
   of its process tree, sampled every 50 ms (what a multi-process build really holds; an upper
   bound, since pages shared between processes count once per process);
2. the data-bin's size on disk;
3. the batch plan of one epoch as a DDP rank builds it (TokenBatchSampler over the train sizes,
   the corpus's 4000-token budget, fairseq's order, rank 0 of 2): build plus the epoch's shard;
4. the loader's real (source + target) tokens/s, DataLoader + collate in-process, first batches;
5. start-up: a subprocess that composes conf/ as run.py does (data=multi30k on this corpus,
   max_update=1, final_test=false) and calls `convseq.tasks.train.train`; the figure is the time
   from just before the process is spawned to the end of the first update (interpreter start,
   imports, finding the data-bin by hashing its inputs, model, Trainer, batch plan, first batch).

The corpus: Multi30k's real train pairs (<data root>/multi30k: $CONVSEQ_DATA_ROOT, else
../shared/data) sampled with replacement, with a fixed seed. The toy grammar was the alternative; it was rejected because what dominates these
figures is the recipe's subword pipeline, and the toy corpus has none (`subword.type=none`, a
whitespace vocabulary from a fixed lexicon, lengths 3-30 from a synthetic grammar). Sampling real
sentences keeps the real length distribution (German/English captions, ~13 words) and runs the
recipe's settings unchanged (conf/data/multi30k.yaml: joint sentencepiece BPE 8000, one joined
dictionary), so sentencepiece training and encoding cost what they cost on real text. What it
flatters: the ~29k distinct pairs repeat, so the vocabulary never grows with N (the dictionary is
bounded by the 8000 pieces anyway) and sentencepiece's BPE merges count few distinct words; a real
3M-pair corpus has far more distinct words. Valid and test are Multi30k's own, at every N.

Corpus files go under `--work` (default /tmp/convseq-bench-scale, never inside the project) and are
reused when their stamp matches; generating them is not timed.

    python bench/bench_scale.py                                  # 100k, 1M, 3M
    python bench/bench_scale.py --sizes 100k,1M --json s.json --plot s.png
    python bench/bench_scale.py --dry-run                        # 2k and 5k, under a minute
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from machine import machine, machine_line  # bench/, beside this script (on sys.path as a script)

ROOT = Path(__file__).resolve().parents[1]
# the data root as conf/paths/default.yaml reads it, else ../shared/data beside the project
MULTI30K = (
    Path(os.environ.get("CONVSEQ_DATA_ROOT") or ROOT.parent / "shared" / "data").absolute()
    / "multi30k"
)
MARK = "BENCH_SCALE_RESULT "  # prefix of the one stdout line a child reports through
CORPUS_VERSION = 1  # bump when the sampling changes what a (seed, N) produces
MiB = 1 << 20
GiB = 1 << 30
# Targets: (3M / 1M) time ratio within 20% of linear; preprocessing at 1M (today's figure);
# peak memory at 3M; one epoch's batch plan at 3M.
LINEAR_SLACK, PREP_1M_S, RSS_3M, PLAN_3M_S = 1.2, 55.0, 1.5 * GiB, 10.0


def parse_size(text: str) -> int:
    """'100k' -> 100000, '3M' -> 3000000, '500' -> 500."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmM]?)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 100k, 1M)")
    return int(float(m[1]) * {"": 1, "k": 1e3, "m": 1e6}[m[2].lower()])


def size_name(n: int) -> str:
    for unit, div in (("M", 10**6), ("k", 10**3)):
        if n >= div and n % (div // 10) == 0:
            return f"{n / div:g}{unit}"
    return str(n)


# -- corpus ----------------------------------------------------------------------------------------
def make_corpus(work: Path, n: int, seed: int, data: dict) -> Path:
    """A folder with train.{de,en} (N sampled Multi30k pairs) and Multi30k's valid/test."""
    folder = work / f"multi30k-sampled-{size_name(n)}-seed{seed}"
    want = {"version": CORPUS_VERSION, "n": n, "seed": seed, "source": str(MULTI30K)}
    stamp = folder / "corpus.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return folder
    src, tgt = data["src_lang"], data["tgt_lang"]
    lines = {
        lang: (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        for lang in (src, tgt)
    }
    # Sample only pairs the recipe keeps (its drop regex removes two "@@" lines), so that the
    # data-bin holds exactly N train pairs.
    drop = re.compile(data["drop_train_regex"]) if data.get("drop_train_regex") else None
    pairs = enumerate(zip(lines[src], lines[tgt]))
    pool = [i for i, pair in pairs if not (drop and any(drop.fullmatch(x.strip()) for x in pair))]
    picks = np.asarray(pool)[np.random.default_rng(seed).integers(0, len(pool), n)]
    folder.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)  # a half-written folder is never taken for a finished one
    for lang in (src, tgt):
        side = lines[lang]
        (folder / f"train.{lang}").write_text("".join(side[i] + "\n" for i in picks), "utf-8")
        for split in ("valid", "test"):
            shutil.copyfile(MULTI30K / f"{split}.{lang}", folder / f"{split}.{lang}")
    stamp.write_text(json.dumps(want))
    return folder


# -- subprocesses ----------------------------------------------------------------------------------
def tree_rss(root: int) -> int:
    """Summed RSS (bytes) of `root` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except OSError:
            pass
    return total * os.sysconf("SC_PAGE_SIZE")


def run_child(mode: str, spec: dict, log: Path) -> dict:
    """Run this file as `--child mode` in a fresh process; its result plus its memory figures."""
    spec = {**spec, "t0": time.time()}  # the child measures start-up from here
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", mode, "--spec", json.dumps(spec)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.05)
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} child failed ({proc.returncode}); last lines:\n{text[-2000:]}")
    result = json.loads([ln for ln in text.splitlines() if ln.startswith(MARK)][-1][len(MARK) :])
    return {**result, "tree_peak": max(peak, result["maxrss"])}


def own_peak_rss() -> int:
    """Largest RSS (bytes) of this process or any of its finished children.

    Measured from inside: the parent's wait4 rusage would also count the parent's own pages that
    the forked child held until its exec (Linux folds the pre-exec peak into ru_maxrss).
    """
    hwm = next(
        ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("VmHWM:")
    )
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    return max(int(hwm.split()[1]), children) * 1024


def child_preprocess(spec: dict) -> dict:
    from convseq.data.preprocess import prepare_databin

    t = time.perf_counter()
    path = prepare_databin(spec["data"], spec["cache"], progress=False)
    return {"seconds": time.perf_counter() - t, "path": str(path), "maxrss": own_peak_rss()}


def child_startup(spec: dict) -> dict:
    import pytorch_lightning as pl
    from hydra import compose, initialize_config_dir

    from convseq.cli.schema import register_configs
    from convseq.tasks.config import as_config
    from convseq.tasks.train import train

    t0, marks = spec["t0"], {"imports": time.time() - spec["t0"]}

    class Marks(pl.Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            marks["train_start"] = time.time() - t0  # data-bin found, model and Trainer built

        def on_train_batch_end(self, trainer, *args) -> None:
            marks.setdefault("first_update", time.time() - t0)

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=spec["overrides"])
    cfg.paths.output_dir = spec["output_dir"]
    train(as_config(cfg), callbacks=[Marks()])
    return {**marks, "process": time.time() - t0, "maxrss": own_peak_rss()}


# -- in-process measurements -----------------------------------------------------------------------
def plan_and_loader(data: dict, cache: str, repeats: int, loader_batches: int) -> dict:
    """Batch plan of one epoch (rank 0 of 2) and loader tokens/s, as the DataModule builds them."""
    from torch.utils.data import DataLoader

    from convseq.data.batching import TokenBatchSampler
    from convseq.data.datamodule import TranslationDataModule

    batching = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "batching" / "tokens.yaml"))
    batching.pop("defaults", None)  # Hydra's lookup of batch_sizes' own sizes: none for multi30k
    dm = TranslationDataModule(data, batching, cache)
    dm.setup("fit")
    ds = dm.dataset("train")

    b = {k: batching[k] for k in ("max_tokens", "required_batch_size_multiple", "order")}

    def sampler(rank: int, world: int) -> TokenBatchSampler:
        # the train sampler's arguments in TranslationDataModule.batch_sampler
        sizes = (ds.src_sizes, ds.tgt_sizes)
        return TokenBatchSampler(*sizes, **b, max_positions=dm.max_positions, shuffle=True,
                                 seed=dm.seed, rank=rank, world_size=world)  # fmt: skip

    builds, shards = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        s = sampler(0, 2)
        t1 = time.perf_counter()
        shard = list(s)  # the index lists this rank's loader consumes in epoch 0
        builds.append(t1 - t)
        shards.append(time.perf_counter() - t1)
    build, shard_s = statistics.median(builds), statistics.median(shards)

    loader = DataLoader(ds, batch_sampler=sampler(0, 1), collate_fn=ds.collater)
    tokens = n = 0
    t = time.perf_counter()
    for batch in itertools.islice(loader, loader_batches):
        tokens += batch["ntokens"] + int(batch["net_input"]["src_lengths"].sum())
        n += 1
    seconds = time.perf_counter() - t
    return dict(train_pairs=len(ds), train_tokens=int(ds.src_sizes.sum() + ds.tgt_sizes.sum()),
                plan_build_s=build, plan_shard_s=shard_s, plan_s=build + shard_s,
                rank_batches=len(shard), loader_batches=n, loader_s=seconds,
                loader_tok_s=tokens / seconds)  # fmt: skip


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- the benchmark ---------------------------------------------------------------------------------
def measure(n: int, args: argparse.Namespace, data: dict, workers: list[int]) -> dict:
    corpus = make_corpus(args.work, n, args.seed, data)
    data = {**data, "dir": str(corpus)}
    row: dict[str, Any] = {"n": n, "preprocess": {}}
    logs = args.work / "logs"
    logs.mkdir(exist_ok=True)
    kept = None
    for w in workers:
        cache = args.work / "cache" / f"{size_name(n)}-w{w}"
        shutil.rmtree(cache, ignore_errors=True)  # a fresh build, never a reused data-bin
        wdata = {**data, "workers": w} if "workers" in args.data_fields else data
        log = logs / f"preprocess-{size_name(n)}-w{w}.log"
        r = run_child("preprocess", {"data": wdata, "cache": str(cache)}, log)
        row["preprocess"][str(w)] = {k: r[k] for k in ("seconds", "maxrss", "tree_peak")}
        if kept is None:
            kept, databin = cache, Path(r["path"])
            row["databin_bytes"] = dir_bytes(databin)
        else:
            shutil.rmtree(cache, ignore_errors=True)  # same content as the kept one
    row.update(plan_and_loader(data, str(kept), args.repeats, args.loader_batches))
    run_dir = args.work / "runs" / size_name(n)
    shutil.rmtree(run_dir, ignore_errors=True)  # train refuses a folder that holds a run
    overrides = [f"data.dir={corpus}", f"paths.cache_dir={kept}", f"model={args.model}"]
    overrides += "data=multi30k max_update=1 final_test=false trainer.max_epochs=1".split()
    overrides.append("trainer.enable_progress_bar=false")
    spec = {"overrides": overrides, "output_dir": str(run_dir)}
    r = run_child("startup", spec, logs / f"startup-{size_name(n)}.log")
    row["startup"] = {k: r[k] for k in ("imports", "train_start", "first_update", "process")}
    shutil.rmtree(run_dir, ignore_errors=True)  # its checkpoint: ~150 MB for fconv_iwslt_de_en
    return row


def checks(rows: list[dict], workers: list[int]) -> list[dict]:
    """The targets, each PASS, FAIL or n/a (a size it needs was not measured)."""
    by_n = {r["n"]: r for r in rows}
    out: list[dict] = []

    def add(name: str, value: float | None, limit: float, unit: str) -> None:
        status = "n/a" if value is None else ("PASS" if value <= limit else "FAIL")
        out.append({"check": name, "value": value, "limit": limit, "unit": unit, "status": status})

    # Linear growth between 1M and 3M, or between the two largest sizes when those are absent.
    pair = (10**6, 3 * 10**6) if {10**6, 3 * 10**6} <= set(by_n) else tuple(sorted(by_n)[-2:])
    timed = {f"preprocess {w}w": lambda r, w=w: r["preprocess"][str(w)]["seconds"] for w in workers}
    timed["batch plan"] = lambda r: r["plan_s"]
    for name, get in timed.items():
        if len(pair) < 2:
            add(f"{name}: linear growth (one size)", None, LINEAR_SLACK, "x linear")
            continue
        a, b = pair
        ratio = get(by_n[b]) / get(by_n[a])
        add(f"{name}: t({size_name(b)})/t({size_name(a)})", ratio, b / a * LINEAR_SLACK, "x")
    one_m, three_m = by_n.get(10**6), by_n.get(3 * 10**6)
    add("preprocess 1w at 1M", one_m and one_m["preprocess"]["1"]["seconds"], PREP_1M_S, "s")
    for w in workers:
        peak = three_m and three_m["preprocess"][str(w)]["tree_peak"] / GiB
        add(f"peak RSS preprocess {w}w at 3M", peak, RSS_3M / GiB, "GiB")
    add("batch plan at 3M", three_m and three_m["plan_s"], PLAN_3M_S, "s")
    return out


def print_table(rows: list[dict], workers: list[int]) -> None:
    head = f"{'N':>6}"
    for w in workers:
        head += f" {f'prep {w}w s':>10} {f'RSS {w}w MiB':>12} {'(max 1 proc)':>12}"
    print(f"{head} {'bin MiB':>8} {'plan s':>7} {'batches':>8} {'loader tok/s':>13} 1st update s")
    for r in rows:
        line = f"{size_name(r['n']):>6}"
        for w in workers:
            p = r["preprocess"][str(w)]
            peaks = f"{p['tree_peak'] / MiB:>12,.0f} {p['maxrss'] / MiB:>12,.0f}"
            line += f" {p['seconds']:>10.1f} {peaks}"
        line += (
            f" {r['databin_bytes'] / MiB:>8.1f} {r['plan_s']:>7.2f} {r['rank_batches']:>8,}"
            f" {r['loader_tok_s'] / 1e6:>12.1f}M {r['startup']['first_update']:>12.1f}"
        )
        print(line)


def plot(rows: list[dict], workers: list[int], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from convseq.viz.canvas import save_png

    n = np.array([r["n"] for r in rows], dtype=float)
    fig = Figure(figsize=(11, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax_t, ax_m = fig.subplots(1, 2)
    series = []
    for w in workers:
        plural = "s" * (w > 1)
        prep = [r["preprocess"][str(w)] for r in rows]
        series.append((ax_t, [p["seconds"] for p in prep], "o-", f"preprocess, {w} worker{plural}"))
        peak = [p["tree_peak"] / MiB for p in prep]
        series.append((ax_m, peak, "o-", f"peak RSS preprocess, {w} worker{plural}"))
    series += [
        (ax_t, [r["plan_s"] for r in rows], "s-", "batch plan (rank 0 of 2)"),
        (ax_t, [r["startup"]["first_update"] for r in rows], "^-", "start-up to 1st update"),
        (ax_t, [r["train_tokens"] / r["loader_tok_s"] for r in rows], "v-", "loader, one epoch"),
        (ax_m, [r["databin_bytes"] / MiB for r in rows], "s-", "data-bin on disk"),
    ]
    for ax, ys, style, label in series:
        ax.plot(n, ys, style, label=label)
    first = rows[0]["preprocess"][str(workers[0])]["seconds"]
    ax_t.plot(n, first * n / n[0], ":", color="grey", label="linear")
    ax_t.set(ylabel="seconds", title="time against corpus size")
    ax_m.set(ylabel="MiB", title="memory and disk against corpus size")
    for ax in (ax_t, ax_m):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("train sentence pairs")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100k,1M,3M", help="train pairs, e.g. 100k,1M,3M")
    ap.add_argument("--dry-run", action="store_true", help="2k and 5k pairs, fconv_toy")
    work = Path(tempfile.gettempdir()) / "convseq-bench-scale"
    ap.add_argument("--work", type=Path, default=work, help=f"corpora and caches ({work})")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--seed", type=int, default=1, help="seed of the corpus sampling")
    ap.add_argument("--repeats", type=int, default=3, help="batch plan: median of this many")
    ap.add_argument("--loader-batches", type=int, default=3000)
    ap.add_argument("--model", default="fconv_iwslt_de_en", help="start-up: conf/model option")
    ap.add_argument("--child", choices=["preprocess", "startup"], help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    return ap.parse_args()


def data_settings(args: argparse.Namespace) -> tuple[dict, dict, list[int]]:
    """(conf/data/multi30k.yaml, its subword settings, the worker counts to measure), printed."""
    from convseq.data.config import DataConfig, SubwordConfig

    args.data_fields = {f.name for f in fields(DataConfig)}
    workers = [1, 2] if "workers" in args.data_fields else [1]
    data_yaml = OmegaConf.load(ROOT / "conf" / "data" / "multi30k.yaml")
    data_yaml.dir = "unset"  # replaced per corpus; `paths` does not exist outside Hydra
    data = OmegaConf.to_container(data_yaml, resolve=True)
    sub = {**{f.name: f.default for f in fields(SubwordConfig)}, **data.get("subword", {})}
    print(f"corpus: Multi30k train pairs sampled with replacement, seed {args.seed}: {args.work}")
    spm = f"{sub['type']} {sub['vocab_size']}, joint={sub['joint']}"
    spm += f", input_sentence_size={sub['input_sentence_size']} (0: all sentences)"
    print(f"data: conf/data/multi30k.yaml: {spm}, vocab.joined={data['vocab']['joined']}")
    if workers == [1]:
        print("data.workers is not in the data config (src/convseq/data/config.py) yet: "
              "preprocessing measured with 1 worker only")  # fmt: skip
    return data, sub, workers


def measure_sizes(sizes: list[int], args: argparse.Namespace, data: dict, workers: list[int]):
    """One row of measurements per corpus size, each timed as it goes."""
    rows = []
    for n in sizes:
        t = time.perf_counter()
        rows.append(measure(n, args, data, workers))
        print(f"  {size_name(n)} measured in {time.perf_counter() - t:.0f} s", flush=True)
    print()
    return rows


def report_rows(rows: list[dict], workers: list[int]) -> list[dict]:
    """The table, its legend and the checks against the limits; the checks returned."""
    print_table(rows, workers)
    print("prep: prepare_databin wall time; RSS: peak of the process tree (every 50 ms) and the")
    print("largest single process (VmHWM / ru_maxrss); plan: build + shard one epoch, rank 0 of 2;")
    print("loader: real src+tgt tokens/s; 1st update: from spawning the process to its 1st update")
    results = checks(rows, workers)
    print()
    for c in results:
        value = "-" if c["value"] is None else f"{c['value']:.2f}"
        print(f"{c['status']:<5} {c['check']:<40} {value:>8} <= {c['limit']:g} {c['unit']}")
    return results


def main() -> int:
    args = parse_args()
    if args.child:
        fn = child_preprocess if args.child == "preprocess" else child_startup
        print(MARK + json.dumps(fn(json.loads(args.spec))), flush=True)
        return 0
    if not (MULTI30K / "train.de").is_file():
        print(f"skipped: Multi30k not found at {MULTI30K}")
        return 0
    info = machine()
    print(machine_line(info))
    if args.dry_run:
        # the toy model: start-up at 2k pairs is then the machinery, not a big model's first step
        args.sizes, args.model, args.loader_batches = "2k,5k", "fconv_toy", 200
        args.repeats = max(args.repeats, 5)  # a plan of a millisecond: a steadier median
    sizes = sorted({parse_size(s) for s in args.sizes.split(",")})
    args.work = args.work.absolute()
    args.work.mkdir(parents=True, exist_ok=True)
    data, sub, workers = data_settings(args)
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}; start-up model {args.model}\n")

    rows = measure_sizes(sizes, args, data, workers)
    results = report_rows(rows, workers)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = dict(machine=info, sizes=sizes, workers=workers, seed=args.seed,
                      model=args.model, subword=sub, cores=os.cpu_count(), rows=rows,
                      checks=results)  # fmt: skip
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        plot(rows, workers, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
