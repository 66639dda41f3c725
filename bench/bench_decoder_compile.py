"""What `torch.compile` of the decoder step, and a cheaper first step, could give the beam search.

Two measurements on one trained model (or a random preset with ``--random``), in one process:

- **compile**: the search's decoder call (`IncrementalDecoderModel.decode`: the incremental
  decoder step and its log-softmax) compiled with inductor (``dynamic=True``) against the eager
  one, alternating, after one untimed compiled run that pays the compilation (its time is
  printed). Prints sentences/s of each, the ratio of medians, and whether the best hypotheses
  are identical.
- **step 0**: the share of a search spent in the decoder at its first step, where every beam of a
  sentence holds the same prefix (``<eos>``), so that ``beam - 1`` of every ``beam`` rows repeat
  one computation; decoding one row per sentence there could save at most about that share.

    CK=outputs/m30k/deen_e21/checkpoints/best.ckpt
    CONVSEQ_DATA_ROOT=../shared/data python bench/bench_decoder_compile.py --ckpt $CK
    python bench/bench_decoder_compile.py --random --sentences 64 --repeats 1   # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from convseq.search import beam_search  # noqa: E402
from convseq.search.interface import IncrementalDecoderModel  # noqa: E402
from machine import machine, machine_line  # noqa: E402
from search_inputs import (  # noqa: E402
    file_sources,
    make_batches,
    random_model,
    random_sources,
    trained_model,
)


class FirstStepTimer:
    """A search timer that adds up the decoder's time, and apart its first call of each search."""

    def __init__(self) -> None:
        self.decoder = 0.0
        self.first_step = 0.0
        self.calls = 0
        self._fresh = True

    def new_search(self) -> None:
        self._fresh = True

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        if name != "decoder":
            return
        spent = time.perf_counter() - start
        self.decoder += spent
        self.calls += 1
        if self._fresh:
            self.first_step += spent
            self._fresh = False


def translate(model, batches, beam: int, timer: FirstStepTimer | None = None):
    """(seconds, best hypotheses as token lists) of one pass over ``batches``."""
    hyps: list[list[int]] = []
    start = time.perf_counter()
    for src, lengths in batches:
        if timer is not None:
            timer.new_search()
        for nbest in beam_search(
            model, src, lengths, beam=beam, max_len_a=0, max_len_b=200, timer=timer
        ):
            hyps.append(nbest[0]["tokens"].tolist())
    return time.perf_counter() - start, hyps


def compiled(model) -> IncrementalDecoderModel:
    """A search model whose decoder call is compiled (inductor, dynamic shapes)."""
    search_model = IncrementalDecoderModel(model)
    search_model.decode = torch.compile(search_model.decode, dynamic=True)
    return search_model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ckpt", help="a trained convseq checkpoint")
    p.add_argument("--src-file", default=str(ROOT.parent / "shared/data/multi30k/test.de"))
    p.add_argument("--random", action="store_true", help="fconv_iwslt_de_en, random weights")
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-compile", action="store_true")
    args = p.parse_args(argv)
    if not args.random and not args.ckpt:
        p.error("give --ckpt (a trained model) or --random")
    return args


def model_and_sources(args: argparse.Namespace) -> tuple:
    """(model, source sentences as token ids): random weights and sentences, or a checkpoint's."""
    if args.random:
        model = random_model("fconv_iwslt_de_en", 4000, 0.3, "cpu")
        sources = random_sources(args.sentences, (6, 30), 4000, seed=1)
    else:
        model, translator = trained_model(args.ckpt, "cpu")
        sources = file_sources(args.src_file, translator, args.sentences)
    return model, sources


def first_step_share(model, batches, args: argparse.Namespace) -> float:
    """The median share of a search's time that its step 0 decoder call takes, printed."""
    shares = []
    for _ in range(args.repeats):
        timer = FirstStepTimer()
        seconds, _ = translate(model, batches, args.beam, timer)
        shares.append(timer.first_step / seconds)
    share = statistics.median(shares)
    print(f"step 0's decoder call: {100 * share:.1f}% of a search "
          f"(median of {args.repeats})", flush=True)  # fmt: skip
    return share


def eager_vs_compiled(model, fast, batches, n: int, args: argparse.Namespace) -> dict:
    """Alternating timed passes of the eager and compiled models: figures and identical hypotheses."""
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    # each arm's best hypotheses, from its last timed pass (every pass gives the same)
    hyps_of: dict[str, list[list[int]]] = {}
    for r in range(args.repeats):
        order = ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager")
        for arm in order:
            seconds, hyps_of[arm] = translate(model if arm == "eager" else fast, batches, args.beam)
            times[arm].append(seconds)
            print(f"repeat {r + 1} {arm:8s} {n / seconds:7.1f} sentences/s", flush=True)
    eager_s, fast_s = (statistics.median(times[a]) for a in ("eager", "compiled"))
    same = sum(a == b for a, b in zip(hyps_of["eager"], hyps_of["compiled"], strict=True))
    return {
        "eager_sents_per_s": n / eager_s,
        "compiled_sents_per_s": n / fast_s,
        "ratio": eager_s / fast_s,
        "identical": same,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    info = machine()
    print(machine_line(info), flush=True)
    model, sources = model_and_sources(args)
    batches = make_batches(sources, args.batch, "cpu")
    result: dict = {"sentences": len(sources), "beam": args.beam, "batch": args.batch}
    result["machine"] = info
    result["step0_share"] = first_step_share(model, batches, args)
    if args.skip_compile:
        return result

    fast = compiled(model)
    compile_seconds = translate(fast, batches, args.beam)[0]  # compiles as it goes
    result["first_compiled_pass_s"] = compile_seconds
    print(f"first compiled pass (compiling): {compile_seconds:.1f} s", flush=True)
    result.update(eager_vs_compiled(model, fast, batches, len(sources), args))
    print(f"eager {result['eager_sents_per_s']:.1f} sentences/s, compiled "
          f"{result['compiled_sents_per_s']:.1f}: {result['ratio']:.2f}x; best hypotheses "
          f"identical {result['identical']}/{len(sources)}")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
