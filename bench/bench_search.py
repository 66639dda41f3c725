"""Benchmark: the tensorized beam search against the reference search, throughput, ablations.

A randomly initialised preset (fconv_iwslt_de_en by default, 8000-word vocabularies) translates
synthetic sources whose lengths are drawn uniformly from `--src-lens`. Random weights give no
natural output length, so lengths are made realistic this way: every sentence stops by its own
limit ``max_len_a * src_len + max_len_b`` (1.0 and 2 by default: outputs about as long as their
sources), and the EOS logit gets a bias (`--eos-bias`) under which some hypotheses end earlier,
so that finalisation and batch shrinking happen at many steps, not only at the limit. Sentences
are batched in source-length order, as fairseq batches them.

In one process, interleaved (each repeat runs every arm once, in a rotating order), medians of
`--repeats` runs, wall and CPU clocks:

1. Arms at `--beam` x `--batch` (5 x 64): the tensorized search; the reference search (the Lua
   loop structure: tensorized selection off); and the tensorized search with one optimisation
   off at a time: batch shrinking, folded weight norm, attention once per sentence (BeamableMM),
   and attention output. For each: the whole-run time, its ratio to the tensorized search, and
   the time per phase (`convseq.search.PHASES`); "search" is selection + finalisation, the part
   the tensorized search replaces (the masking and the topk over beam x vocab, phase
   "candidates", are the same tensor operations in both searches, as in the Lua toolkit).
2. The search phase per decoder step, reference vs tensorized, as beam x batch grows (the
   reference's Python work grows with the number of candidates, 2 x beam x batch per step).
3. Throughput of the tensorized search: sentences/s and output tokens/s at beam 1 and 5 and
   batch 1, 16, 64, 128.

    python bench/bench_search.py                  # the figures in docs/search.md (~10 min, 1 thread)
    python bench/bench_search.py --quick          # a small version (~1 min)
    python bench/bench_search.py --device cuda    # on a GPU (phases timed with a sync each)
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from omegaconf import OmegaConf

from convseq.models.fconv import FConvModel
from convseq.search import PHASES, PhaseTimer, beam_search, reference_beam_search

CONF = Path(__file__).resolve().parents[1] / "conf" / "model"
PAD, EOS = 1, 2


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arch", default="fconv_iwslt_de_en", help="a preset in conf/model")
    p.add_argument("--vocab", type=int, default=8000, help="source and target vocabulary size")
    p.add_argument("--sentences", type=int, default=128, help="sentences per run")
    p.add_argument("--src-lens", type=int, nargs=2, default=[6, 30], help="source length range")
    p.add_argument("--max-len-a", type=float, default=1.0)
    p.add_argument("--max-len-b", type=int, default=2)
    p.add_argument("--eos-bias", type=float, default=0.3, help="added to the EOS logit")
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
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument(
        "--scaling",
        nargs="*",
        default=["5x16", "5x64", "5x128", "12x128"],
        help="BEAMxBATCH cells of the search-phase scaling table (none: skip it)",
    )
    p.add_argument("--quick", action="store_true", help="a small version: fewer of everything")
    args = p.parse_args()
    if args.quick:
        args.sentences, args.throughput_sentences, args.repeats = 32, 32, 3
        args.batch, args.batches, args.scaling = 32, [1, 32], ["5x8", "5x32"]
    return args


class TwoClocks:
    """A search timer reading the wall and the CPU clock around every phase."""

    def __init__(self, synchronize: Callable[[], None] | None):
        self.wall = PhaseTimer(synchronize)
        self.cpu = PhaseTimer(synchronize, clock=time.process_time)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with self.wall.phase(name), self.cpu.phase(name):
            yield


def make_batches(
    n: int, batch: int, lens: tuple[int, int], vocab: int, seed: int, device: str
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`n` random left-padded sources in length order, cut into batches of `batch`."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lens[0], lens[1] + 1, (n,), generator=gen).sort().values
    out = []
    for start in range(0, n, batch):
        chunk = lengths[start : start + batch]
        width = int(chunk.max())
        src = torch.full((len(chunk), width), PAD)
        for i, length in enumerate(chunk.tolist()):
            src[i, width - length :] = torch.randint(4, vocab, (length,), generator=gen)
            src[i, -1] = EOS
        out.append((src.to(device), chunk.to(device)))
    return out


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
        "phases_wall": dict(timer.wall.seconds),
        "phases_cpu": dict(timer.cpu.seconds),
        "calls": dict(timer.cpu.calls),
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


def arms_table(args, model, sync) -> None:
    common = dict(
        beam=args.beam, max_len_a=args.max_len_a, max_len_b=args.max_len_b, nbest=1
    )  # fmt: skip
    arms = {
        "tensorized": (beam_search, {}),
        "reference": (reference_beam_search, {}),
        "no shrinking": (beam_search, {"shrink": False}),
        "no folded wn": (beam_search, {"fold_weight_norm": False}),
        "no beamable mm": (beam_search, {"beamable_mm": False}),
        "no attn output": (beam_search, {"need_attn": False}),
    }
    batches = make_batches(
        args.sentences, args.batch, args.src_lens, args.vocab, args.seed, args.device
    )
    names = list(arms)
    for name in names:  # warm-up: allocator, thread pool, first-call overheads
        search, extra = arms[name]
        run(search, model, batches[:1], sync, **common, **extra)
    results: dict[str, list[dict]] = {name: [] for name in names}
    for rep in range(args.repeats):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            search, extra = arms[name]
            results[name].append(run(search, model, batches, sync, **common, **extra))

    base = results["tensorized"]
    n_out = base[0]["tokens"] / base[0]["sentences"]
    print(
        f"\n## Arms: beam {args.beam}, batch {args.batch}, {args.sentences} sentences, "
        f"mean output {n_out:.1f} tokens (EOS included), median of {args.repeats}"
    )
    for clock in ("wall", "cpu"):
        print(f"\n{clock} clock, seconds per run (ratio = arm / tensorized, whole run)")
        cols = ["total", "ratio", *PHASES, "search"]
        print(f"{'arm':<15}" + "".join(f"{c[:12]:>13}" for c in cols))
        for name in names:
            rs = results[name]
            total = med(rs, clock)
            cells = [total, total / med(base, clock)]
            cells += [med(rs, f"phases_{clock}", p) for p in PHASES]
            cells.append(summed(rs, clock, SEARCH))
            print(f"{name:<15}" + "".join(f"{c:13.3f}" for c in cells))
        ref = results["reference"]
        ratio = summed(ref, clock, SEARCH) / summed(base, clock, SEARCH)
        ratio_all = summed(ref, clock, SEARCH_ALL) / summed(base, clock, SEARCH_ALL)
        print(
            f"reference / tensorized: search phase (selection + finalisation) {ratio:.1f}x; "
            f"with the candidate topk {ratio_all:.1f}x; whole run "
            f"{med(ref, clock) / med(base, clock):.2f}x"
        )
        for name in ("tensorized", "reference"):
            rs = results[name]
            shares = {p: med(rs, f"phases_{clock}", p) / med(rs, clock) for p in PHASES}
            print(
                f"{name} run by phase: "
                + ", ".join(f"{p} {100 * v:.1f}%" for p, v in shares.items())
                + f", outside the phases {100 * (1 - sum(shares.values())):.1f}%"
            )
    for name in names:
        same = sum(a == b for a, b in zip(results[name][0]["best"], base[0]["best"]))
        print(
            f"best outputs equal to the tensorized search's: {name}: {same}/{len(base[0]['best'])}"
        )


def scaling_table(args, model, sync) -> None:
    """The search phase per step, reference vs tensorized, as beam x batch grows."""
    common = dict(max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    cells = [tuple(int(v) for v in c.split("x")) for c in args.scaling]
    arms = {"tensorized": beam_search, "reference": reference_beam_search}
    sets = {
        batch: make_batches(batch, batch, args.src_lens, args.vocab, args.seed, args.device)
        for _, batch in cells
    }
    results: dict[tuple[str, int, int], list[dict]] = {}
    for rep in range(args.repeats + 1):  # the first pass warms up
        for beam, batch in cells:
            for name in list(arms)[:: 1 if rep % 2 else -1]:
                r = run(arms[name], model, sets[batch], sync, beam=beam, **common)
                r["steps"] = r["calls"]["decoder"]
                if rep:
                    results.setdefault((name, beam, batch), []).append(r)
    print(
        f"\n## Search phase per step as beam x batch grows: one batch per run, median of "
        f"{args.repeats}, CPU clock, ms per decoder step"
    )
    print(
        f"{'beam':>5}{'batch':>7}{'cands':>7}{'steps':>6}"
        + "".join(f"{h:>13}" for h in ("tens search", "ref search", "ratio", "candidates"))
    )
    for beam, batch in cells:
        fast, ref = results[("tensorized", beam, batch)], results[("reference", beam, batch)]
        steps = fast[0]["steps"]
        t_fast = summed(fast, "cpu", SEARCH) / steps * 1000
        t_ref = summed(ref, "cpu", SEARCH) / steps * 1000
        t_cand = summed(fast, "cpu", ("candidates",)) / steps * 1000
        print(
            f"{beam:>5}{batch:>7}{2 * beam * batch:>7}{steps:>6}"
            f"{t_fast:13.3f}{t_ref:13.3f}{t_ref / t_fast:12.1f}x{t_cand:13.3f}"
        )


def throughput_table(args, model, sync) -> None:
    common = dict(max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    cells = [(beam, batch) for beam in args.beams for batch in args.batches]
    sets = {
        batch: make_batches(
            args.throughput_sentences, batch, args.src_lens, args.vocab, args.seed, args.device
        )
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
    cfg = OmegaConf.load(CONF / f"{args.arch}.yaml")
    model = FConvModel.build(cfg, args.vocab, args.vocab).to(args.device).eval()
    with torch.no_grad():
        model.decoder.fc3.bias[EOS] += args.eos_bias
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    print(
        f"# {args.arch}, vocab {args.vocab}, sources {args.src_lens[0]}-{args.src_lens[1]} tokens, "
        f"max_len_a {args.max_len_a}, max_len_b {args.max_len_b}, EOS bias {args.eos_bias}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device} "
        f"({torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine()})"
    )
    if not args.skip_arms:
        arms_table(args, model, sync)
    if args.scaling:
        scaling_table(args, model, sync)
    if not args.skip_throughput:
        throughput_table(args, model, sync)


if __name__ == "__main__":
    main()
