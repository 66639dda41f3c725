"""Benchmark: the tensorized beam search against the reference search, throughput, ablations.

Two kinds of input (bench/search_inputs.py):

- a trained model on real text: `--ckpt` (e.g. the Multi30k recipe's best.ckpt) and `--src-file`
  (e.g. test.de); the translations end where the model ends them (max_len_a 0, max_len_b 200);
- by default, a randomly initialised preset (fconv_iwslt_de_en, 8000-word vocabularies) on
  synthetic sources whose lengths are drawn uniformly from `--src-lens`. Random weights give no
  natural output length, so every sentence stops by its own limit ``max_len_a * src_len +
  max_len_b`` (1.0 and 2: outputs about as long as their sources), and the EOS logit gets a
  bias (`--eos-bias`) under which some hypotheses end earlier, so that finalisation and batch
  shrinking happen at many steps, not only at the limit.

Sentences are batched in source-length order, as fairseq batches them.

In one process, interleaved (each repeat runs every arm once, in a rotating order), medians of
`--repeats` runs, wall and CPU clocks (the CPU clock is the one to quote on a shared machine),
with the objects that exist before the runs frozen out of the garbage collector's sight:

1. Arms at `--beam` x `--batch` (5 x 64): the tensorized search; the reference search (the Lua
   loop structure: tensorized selection off); and the tensorized search with one optimisation
   off at a time: batch shrinking, folded weight norm, attention once per sentence (BeamableMM),
   attention output, and leaving the decoder's cached encoder output in place on steps that do
   not shrink the batch ("no cache skip": copied at every step). For each: the whole-run
   time, its ratio to the tensorized search, and the time per phase (`convseq.search.PHASES`);
   "search" is selection + finalisation, the part the tensorized search replaces (the masking
   and the topk over beam x vocab, phase "candidates", are tensor operations in both searches,
   as in the Lua toolkit).
2. The search phase per decoder step, reference vs tensorized, as beam x batch grows (the
   reference's Python work grows with the number of candidates, 2 x beam x batch per step).
3. What the selection's small tensor operations cost: in a tight loop, and right after the
   step's topk over beam x vocab (where they run), to explain the fixed cost per step.
4. Throughput of the tensorized search: sentences/s and output tokens/s at beam 1 and 5 and
   batch 1, 16, 64, 128.

`--baseline REV` adds the searches as they were at git revision REV (their modules read with
`git show`, with the decoder copying its cached encoder output at every step, as it then did) to
tables 1 and 2, interleaved with the current ones: before/after figures from one process.

    python bench/bench_search.py                  # random weights (1 thread)
    python bench/bench_search.py --ckpt outputs/m30k/deen_main/checkpoints/best.ckpt \\
        --src-file ../shared/data/multi30k/test.de  # the trained model: docs/search.md
    python bench/bench_search.py --baseline 587152e --skip-throughput   # before / after
    python bench/bench_search.py --quick          # a small version (~1 min)
    python bench/bench_search.py --device cuda    # on a GPU (phases timed with a sync each)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Iterator

import torch

from convseq.search import PHASES, beam_search, reference_beam_search
from convseq.search.beam import _select
from machine import machine_line  # bench/, beside this script
from search_baseline import CopyingCache, load_baseline  # bench/, beside this script
from search_inputs import (  # bench/, beside this script
    file_sources,
    make_batches,
    random_model,
    random_sources,
    trained_model,
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arch", default="fconv_iwslt_de_en", help="a preset in conf/model")
    p.add_argument("--vocab", type=int, default=8000, help="source and target vocabulary size")
    p.add_argument("--sentences", type=int, default=128, help="sentences per run")
    p.add_argument("--src-lens", type=int, nargs=2, default=[6, 30], help="source length range")
    p.add_argument("--max-len-a", type=float, help="default 1.0 (random model), 0 (--ckpt)")
    p.add_argument("--max-len-b", type=int, help="default 2 (random model), 200 (--ckpt)")
    p.add_argument("--eos-bias", type=float, default=0.3, help="added to the EOS logit")
    p.add_argument("--ckpt", help="a trained checkpoint instead of a random model")
    p.add_argument("--src-file", help="with --ckpt: the raw source text to translate")
    p.add_argument("--beam", type=int, default=5, help="beam of the arms table")
    p.add_argument("--batch", type=int, default=64, help="batch of the arms table")
    p.add_argument("--beams", type=int, nargs="+", default=[1, 5], help="throughput beams")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 128])
    p.add_argument("--throughput-sentences", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: leave as is)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--skip-arms", action="store_true")
    p.add_argument("--skip-op-costs", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument(
        "--scaling",
        nargs="*",
        default=["5x16", "5x64", "5x128", "5x256", "12x128"],
        help="BEAMxBATCH cells of the search-phase scaling table (none: skip it)",
    )
    p.add_argument("--baseline", metavar="REV", help="also run the searches of git revision REV")
    p.add_argument("--quick", action="store_true", help="a small version: fewer of everything")
    args = p.parse_args()
    if bool(args.ckpt) != bool(args.src_file):
        p.error("--ckpt and --src-file go together")
    if args.max_len_a is None:
        args.max_len_a = 0.0 if args.ckpt else 1.0
    if args.max_len_b is None:
        args.max_len_b = 200 if args.ckpt else 2
    if args.quick:
        args.sentences, args.throughput_sentences, args.repeats = 32, 32, 3
        args.batch, args.batches, args.scaling = 32, [1, 32], ["5x8", "5x32"]
    return args


class TwoClocks:
    """A search timer reading the wall and the CPU clock around every phase (one context)."""

    def __init__(self, synchronize: Callable[[], None] | None):
        self.sync = synchronize
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.sync is not None:
            self.sync()
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            if self.sync is not None:
                self.sync()
            self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - cpu
            self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - wall
            self.calls[name] = self.calls.get(name, 0) + 1


def run(search, model, batches, sync, **kwargs) -> dict:
    """One pass over the batches: clocks, phases, output sizes and the best outputs."""
    timer = TwoClocks(sync)
    sync()
    wall, cpu = time.perf_counter(), time.process_time()
    outputs = []
    for src, lengths in batches:
        outputs += search(model, src, lengths, timer=timer, **kwargs)
    sync()
    return {
        "wall": time.perf_counter() - wall,
        "cpu": time.process_time() - cpu,
        "phases_wall": timer.wall,
        "phases_cpu": timer.cpu,
        "calls": timer.calls,
        "sentences": len(outputs),
        "tokens": sum(len(h[0]["tokens"]) for h in outputs),
        "best": [h[0]["tokens"].tolist() for h in outputs],
    }


def med(runs: list[dict], key: str, phase: str | None = None) -> float:
    if phase is None:
        return statistics.median(r[key] for r in runs)
    return statistics.median(r[key].get(phase, 0.0) for r in runs)


def summed(runs: list[dict], clock: str, phases: tuple[str, ...]) -> float:
    """Median over runs of the time spent in `phases` together."""
    return statistics.median(sum(r[f"phases_{clock}"].get(p, 0.0) for p in phases) for r in runs)


SEARCH = ("selection", "finalisation")  # what the tensorized search replaces
SEARCH_ALL = ("candidates", "selection", "finalisation")  # with the topk both searches share


NON_DECODER = ("candidates", "selection", "finalisation", "reorder")  # all of the search's own work


def arms_of(model, baseline: dict[str, Callable]) -> dict[str, tuple]:
    """Each arm's (search, model, extra search arguments): the tensorized search, the reference,
    the tensorized search without one of its levers each, and the baseline commit's searches."""
    arms = {
        "tensorized": (beam_search, model, {}),
        "reference": (reference_beam_search, model, {}),
        "no shrinking": (beam_search, model, {"shrink": False}),
        "no folded wn": (beam_search, model, {"fold_weight_norm": False}),
        "no beamable mm": (beam_search, model, {"beamable_mm": False}),
        "no attn output": (beam_search, model, {"need_attn": False}),
        "no cache skip": (beam_search, CopyingCache(model), {}),
    }
    arms.update({name: (search, CopyingCache(model), {}) for name, search in baseline.items()})
    return arms


def run_arms(args, arms: dict[str, tuple], sync) -> dict[str, list[dict]]:
    """Every arm over the same batches, `args.repeats` times in rotating order, after a warm-up."""
    common = dict(
        beam=args.beam, max_len_a=args.max_len_a, max_len_b=args.max_len_b, nbest=1
    )  # fmt: skip
    batches = make_batches(args.sources(args.sentences), args.batch, args.device)
    names = list(arms)
    for name in names:  # warm-up: allocator, thread pool, first-call overheads
        search, m, extra = arms[name]
        run(search, m, batches[:1], sync, **common, **extra)
    results: dict[str, list[dict]] = {name: [] for name in names}
    for rep in range(args.repeats):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            search, m, extra = arms[name]
            results[name].append(run(search, m, batches, sync, **common, **extra))
    return results


def print_clock(args, results: dict[str, list[dict]], clock: str, baseline: bool) -> None:
    """One clock's table of the arms, the reference's ratios and the share of each phase."""
    names = list(results)
    base = results["tensorized"]
    width = max(len(n) for n in names) + 2
    print(f"\n{clock} clock, seconds per run (ratio = arm / tensorized, whole run)")
    cols = ["total", "ratio", *PHASES, "search"]
    print(f"{'arm':<{width}}" + "".join(f"{c[:12]:>13}" for c in cols))
    for name in names:
        rs = results[name]
        total = med(rs, clock)
        cells = [total, total / med(base, clock)]
        cells += [med(rs, f"phases_{clock}", p) for p in PHASES]
        cells.append(summed(rs, clock, SEARCH))
        print(f"{name:<{width}}" + "".join(f"{c:13.3f}" for c in cells))
    pairs = [("tensorized", "reference")]
    pairs += [(f"tensorized@{args.baseline}", f"reference@{args.baseline}")] if baseline else []
    for fast, slow in pairs:
        f, r = results[fast], results[slow]
        print(
            f"{slow} / {fast}: search phase (selection + finalisation) "
            f"{summed(r, clock, SEARCH) / summed(f, clock, SEARCH):.1f}x; with the "
            f"candidate topk {summed(r, clock, SEARCH_ALL) / summed(f, clock, SEARCH_ALL):.1f}x; "
            f"all but the encoder and decoder "
            f"{summed(r, clock, NON_DECODER) / summed(f, clock, NON_DECODER):.2f}x; "
            f"whole run {med(r, clock) / med(f, clock):.2f}x"
        )
    for name in [n for n in names if n.startswith(("tensorized", "reference"))]:
        rs = results[name]
        shares = {p: med(rs, f"phases_{clock}", p) / med(rs, clock) for p in PHASES}
        print(
            f"{name} run by phase: "
            + ", ".join(f"{p} {100 * v:.1f}%" for p, v in shares.items())
            + f", outside the phases {100 * (1 - sum(shares.values())):.1f}%"
        )


def arms_table(args, model, sync, baseline: dict[str, Callable]) -> None:
    results = run_arms(args, arms_of(model, baseline), sync)
    base = results["tensorized"]
    n_out = base[0]["tokens"] / base[0]["sentences"]
    print(
        f"\n## Arms: beam {args.beam}, batch {args.batch}, {args.sentences} sentences, "
        f"mean output {n_out:.1f} tokens (EOS included), median of {args.repeats}"
    )
    for clock in ("wall", "cpu"):
        print_clock(args, results, clock, bool(baseline))
    for name in results:
        same = sum(a == b for a, b in zip(results[name][0]["best"], base[0]["best"]))
        print(
            f"best outputs equal to the tensorized search's: {name}: {same}/{len(base[0]['best'])}"
        )


def scaling_table(args, model, sync, baseline: dict[str, Callable]) -> None:
    """The search phase per step, reference vs tensorized, as beam x batch grows."""
    common = dict(max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    cells = [tuple(int(v) for v in c.split("x")) for c in args.scaling]
    arms = {"tensorized": (beam_search, model), "reference": (reference_beam_search, model)}
    arms.update({name: (search, CopyingCache(model)) for name, search in baseline.items()})
    sets = {batch: make_batches(args.sources(batch), batch, args.device) for _, batch in cells}
    results: dict[tuple[str, int, int], list[dict]] = {}
    names = list(arms)
    for rep in range(args.repeats + 1):  # the first pass warms up
        for beam, batch in cells:
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                search, m = arms[name]
                r = run(search, m, sets[batch], sync, beam=beam, **common)
                r["steps"] = r["calls"]["decoder"]
                if rep:
                    results.setdefault((name, beam, batch), []).append(r)
    print(
        f"\n## Search phase per step as beam x batch grows: one batch per run, median of "
        f"{args.repeats}, CPU clock, ms per decoder step (search = selection + finalisation; "
        "other = candidates + reorder, the tensor work both searches do)"
    )
    width = max(len(n) for n in names) + 2
    heads = ("selection", "finalis.", "search", "candidates", "reorder", "other")
    print(f"{'beam':>5}{'batch':>7}{'cands':>7}{'steps':>6}  {'arm':<{width}}" + "".join(
        f"{h:>11}" for h in heads
    ))  # fmt: skip
    for beam, batch in cells:
        per_step: dict[str, dict[str, float]] = {}
        for name in names:
            rs = results[(name, beam, batch)]
            steps = rs[0]["steps"]
            ms = {p: summed(rs, "cpu", (p,)) / steps * 1000 for p in PHASES}
            ms["search"] = summed(rs, "cpu", SEARCH) / steps * 1000
            ms["other"] = summed(rs, "cpu", ("candidates", "reorder")) / steps * 1000
            per_step[name] = ms
            cols = ("selection", "finalisation", "search", "candidates", "reorder", "other")
            print(
                f"{beam:>5}{batch:>7}{2 * beam * batch:>7}{steps:>6}  {name:<{width}}"
                + "".join(f"{ms[c]:11.3f}" for c in cols)
            )
        ref, fast = per_step["reference"], per_step["tensorized"]
        line = (
            f"      reference / tensorized: search {ref['search'] / fast['search']:.1f}x, "
            f"search + other {(ref['search'] + ref['other']) / (fast['search'] + fast['other']):.2f}x; "
            f"reference search {1000 * ref['search'] / (2 * beam * batch):.2f} us per candidate"
        )
        if baseline:
            old_fast = per_step[f"tensorized@{args.baseline}"]
            old_ref = per_step[f"reference@{args.baseline}"]
            line += (
                f"; at {args.baseline}: {old_ref['search'] / old_fast['search']:.1f}x; tensorized "
                f"search now {old_fast['search'] / fast['search']:.2f}x faster than then"
            )
        print(line)


def op_costs(args, sync) -> None:
    """What the selection's small operations cost: in a tight loop, and right after the topk.

    The tensorized search's own selection (`convseq.search.beam._select`: nine small tensor
    operations and the host copy) on tensors of a step's shapes.
    """
    beam, bsz, vocab = args.beam, args.batch, args.vocab
    gen = torch.Generator().manual_seed(args.seed)
    lprobs = torch.randn(bsz * beam, vocab, generator=gen).log_softmax(-1).to(args.device)
    cum = torch.randn(bsz * beam, generator=gen).to(args.device) - 5
    eos_lprobs = lprobs[:, 2].clone()  # (rows,)
    total = torch.empty_like(lprobs)
    offsets = torch.arange(bsz, device=args.device).unsqueeze(1) * beam  # (bsz, 1)

    def step_topk():  # the big operation that precedes selection in every step
        torch.add(lprobs, cum.unsqueeze(1), out=total)
        return total.view(bsz, beam * vocab).topk(beam, dim=1)

    print(
        f"\n## Cost of the selection (CPU clock, median of {args.repeats * 40}): the next "
        f"hypotheses and the finished scores of a ({bsz} x {beam}) step, vocab {vocab}"
    )
    with torch.inference_mode():
        scores, idx = step_topk()
        for _ in range(20):
            _select(scores, idx, lprobs, eos_lprobs, cum, offsets, vocab, beam, True)
        sync()
        hot, cold, big = [], [], []
        for _ in range(args.repeats * 40):
            start = time.process_time()
            _select(scores, idx, lprobs, eos_lprobs, cum, offsets, vocab, beam, True)
            sync()
            hot.append(time.process_time() - start)
        for _ in range(args.repeats * 40):
            start = time.process_time()
            scores, idx = step_topk()
            sync()
            mid = time.process_time()
            _select(scores, idx, lprobs, eos_lprobs, cum, offsets, vocab, beam, True)
            sync()
            big.append(mid - start)
            cold.append(time.process_time() - mid)
    print(
        f"selection: in a tight loop {1e6 * statistics.median(hot):.0f} us; right after the "
        f"step's add + topk over ({bsz}, {beam} x {vocab}) "
        f"({1e3 * statistics.median(big):.2f} ms): {1e6 * statistics.median(cold):.0f} us"
    )


def throughput_table(args, model, sync) -> None:
    common = dict(max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    cells = [(beam, batch) for beam in args.beams for batch in args.batches]
    sets = {
        batch: make_batches(args.sources(args.throughput_sentences), batch, args.device)
        for batch in args.batches
    }
    for beam, batch in cells:  # warm-up
        run(beam_search, model, sets[batch][:1], sync, beam=beam, **common)
    results: dict[tuple[int, int], list[dict]] = {c: [] for c in cells}
    for rep in range(args.repeats):
        order = cells[rep % len(cells) :] + cells[: rep % len(cells)]
        for beam, batch in order:
            results[(beam, batch)].append(
                run(beam_search, model, sets[batch], sync, beam=beam, **common)
            )
    print(
        f"\n## Throughput of the tensorized search: {args.throughput_sentences} sentences, "
        f"median of {args.repeats}; sentences/s and output tokens/s by the wall and the CPU clock"
    )
    head = ("wall s", "sent/s", "tok/s", "cpu s", "sent/s", "tok/s", "out tok")
    print(f"{'beam':>5}{'batch':>7}" + "".join(f"{h:>9}" for h in head))
    for beam, batch in cells:
        rs = results[(beam, batch)]
        sent, tok = rs[0]["sentences"], rs[0]["tokens"]
        cells_out = []
        for clock in ("wall", "cpu"):
            seconds = med(rs, clock)
            cells_out.append(f"{seconds:9.2f}{sent / seconds:9.1f}{tok / seconds:9.0f}")
        print(f"{beam:>5}{batch:>7}" + "".join(cells_out) + f"{tok:>9}")


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.ckpt:
        model, translator = trained_model(args.ckpt, args.device)
        args.vocab = len(translator.tgt_dict)
        args.sources = lambda n: file_sources(args.src_file, translator, n)
        what = (
            f"{args.ckpt} ({sum(p.numel() for p in model.parameters()):,} parameters, target "
            f"vocab {args.vocab}), the first lines of {args.src_file}"
        )
    else:
        model = random_model(args.arch, args.vocab, args.eos_bias, args.device)
        args.sources = lambda n: random_sources(n, args.src_lens, args.vocab, args.seed)
        what = (
            f"{args.arch} with random weights, vocab {args.vocab}, sources "
            f"{args.src_lens[0]}-{args.src_lens[1]} tokens, EOS bias {args.eos_bias}"
        )
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    print(f"# {machine_line()}")  # names the GPU too, where there is one
    print(f"# {what}, max_len_a {args.max_len_a}, max_len_b {args.max_len_b}, device {args.device}")
    baseline = load_baseline(args.baseline) if args.baseline else {}
    # A full garbage collection scans every Python object of the process (about 180,000 after
    # the imports) and costs ~0.1 s; the searches' allocations trigger one at random moments,
    # charged to whichever phase runs then (the reference, which makes far more objects, more
    # often). Freezing what exists now leaves those collections only the runs' own objects.
    gc.collect()
    gc.freeze()
    if not args.skip_arms:
        arms_table(args, model, sync, baseline)
    if args.scaling:
        scaling_table(args, model, sync, baseline)
    if not args.skip_op_costs:
        op_costs(args, sync)
    if not args.skip_throughput:
        throughput_table(args, model, sync)


if __name__ == "__main__":
    main()
