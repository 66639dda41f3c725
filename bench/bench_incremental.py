"""Benchmark: one decoder step, incremental vs recomputing the whole prefix.

Decodes random target prefixes of `--lengths` tokens at beam x batch rows through the decoder of
a randomly initialised preset (fconv_iwslt_de_en by default, with an 8000-word vocabulary), and
reports the time per step, median over `--repeats` runs, of three arms run interleaved on the
same inputs in one process:

- incremental+fast: one position per step from the convolution buffers, as beam search does it,
  with a within-beam `reorder_incremental_state` every step, under `generation_mode` (weight norm
  folded, attention once per sentence);
- incremental: the same without the fast paths (weights recomputed per call, one attention
  product per beam copy);
- recompute: the teacher-forced path over the whole prefix at every step, projecting only the
  last position to the vocabulary (weight norm folded, like the first arm).

    python bench/bench_incremental.py --threads 1                      # the figures in docs/model.md
    python bench/bench_incremental.py --batch 8 --lengths 10 20 --repeats 3   # a quick look
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from convseq.models.family import preset_config
from convseq.models.fconv import FConvModel
from machine import machine_line  # bench/, beside this script (on sys.path as a script)

CONF = Path(__file__).resolve().parents[1] / "conf" / "model"
PAD, EOS = 1, 2


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arch", default="fconv_iwslt_de_en", help="a preset in conf/model")
    p.add_argument("--vocab", type=int, default=8000, help="source and target vocabulary size")
    p.add_argument("--batch", type=int, default=64, help="sentences")
    p.add_argument("--beam", type=int, default=5, help="hypotheses per sentence")
    p.add_argument("--src-len", type=int, default=30, help="source length (tokens, EOS included)")
    p.add_argument("--lengths", type=int, nargs="+", default=[10, 30, 60], help="output lengths")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per arm and length")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


def within_beam_orders(steps: int, sentences: int, beam: int, gen: torch.Generator):
    """A random reorder per step that keeps rows inside their sentence's block, as beam search."""
    base = torch.arange(sentences).unsqueeze(1) * beam  # (sentences, 1)
    return [
        (base + torch.randint(0, beam, (sentences, beam), generator=gen)).flatten()
        for _ in range(steps)
    ]


def run_incremental(model, enc, prefix, orders, fast: bool, beam: int) -> None:
    with model.generation_mode(beam_size=beam if fast else None, fold_weight_norm=fast):
        state: dict = {}
        for t in range(prefix.size(1)):
            if t > 0:
                model.reorder_incremental_state(state, orders[t])
            model.decoder(prefix[:, : t + 1], enc, state)  # (rows, 1, V) logits


def run_recompute(model, enc, prefix) -> None:
    with model.generation_mode(fold_weight_norm=True):
        for t in range(prefix.size(1)):
            feats, _ = model.decoder.extract_features(prefix[:, : t + 1], enc)  # (rows, t+1, C)
            model.decoder.output_layer(feats[:, -1:])  # (rows, 1, V): the last position only


def timed(fn: Callable[[], None]) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of one call.

    On a shared machine the CPU time is the steadier figure: with one thread it equals the wall
    time of an idle machine, and it does not grow while other processes hold the cores.
    """
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    cfg = preset_config(CONF / f"{args.arch}.yaml")
    model = FConvModel.build(cfg, args.vocab, args.vocab).eval()
    rows = args.batch * args.beam

    src = torch.randint(4, args.vocab, (args.batch, args.src_len), generator=gen)
    src[:, -1] = EOS
    with torch.no_grad():
        enc = model.encoder(src, None)
    expand = torch.arange(args.batch).repeat_interleave(args.beam)  # beam copies per sentence
    enc = model.reorder_encoder_out(enc, expand)

    arms = ("incremental+fast", "incremental", "recompute")
    results: dict[tuple[str, str, int], list[float]] = {}
    inputs = {}
    for length in args.lengths:
        prefix = torch.randint(4, args.vocab, (rows, length), generator=gen)
        prefix[:, 0] = EOS
        inputs[length] = (prefix, within_beam_orders(length, args.batch, args.beam, gen))

    def call(arm: str, length: int, steps: int | None = None) -> tuple[float, float]:
        prefix, orders = inputs[length]
        prefix = prefix[:, :steps]
        if arm == "recompute":
            return timed(lambda: run_recompute(model, enc, prefix))
        fast = arm == "incremental+fast"
        return timed(lambda: run_incremental(model, enc, prefix, orders, fast, args.beam))

    for length in args.lengths:  # warm-up: allocator, thread pool, first-call overheads
        for arm in arms:
            call(arm, length, steps=3)
    for rep in range(args.repeats):
        for length in args.lengths:
            order = arms if rep % 2 == 0 else arms[::-1]  # alternate which arm goes first
            for arm in order:
                for clock, seconds in zip(("wall", "cpu"), call(arm, length), strict=True):
                    results.setdefault((clock, arm, length), []).append(seconds / length)

    print(f"# {machine_line()}")
    print(
        f"# {args.arch}, vocab {args.vocab}, batch {args.batch} x beam {args.beam} = {rows} rows, "
        f"source {args.src_len} tokens, {args.repeats} repeats"
    )
    for clock in ("wall", "cpu"):
        print(
            f"# ms per decoder step, {clock} clock, median of {args.repeats} runs "
            "(speedup = recompute / incremental+fast)"
        )
        print(f"{'length':>6} " + " ".join(f"{a:>17}" for a in arms) + f" {'speedup':>8}")
        for length in args.lengths:
            ms = {a: statistics.median(results[(clock, a, length)]) * 1000 for a in arms}
            cells = " ".join(f"{ms[a]:17.2f}" for a in arms)
            print(f"{length:>6} {cells} {ms['recompute'] / ms['incremental+fast']:8.2f}x")


if __name__ == "__main__":
    main()
