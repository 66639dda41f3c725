"""The fairseq side of bench/bench_vs_fairseq.py's generation comparison (runs in bench/fairseq-venv).

Standalone: it imports fairseq and torch only, never convseq, because it runs with the
benchmark-only fairseq environment's Python. It loads a checkpoint written by convseq's
`save_fairseq`, translates the batches the driver made once (a torch file of left-padded
(src_tokens, src_lengths) pairs), times the loop, and prints one JSON line: seconds, CPU
seconds, sentences, output tokens and the best hypothesis of every sentence (token ids).

    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 bench/fairseq-venv/bin/python bench/fairseq_side.py \
        --ckpt DIR/checkpoint.pt --batches batches.pt --beam 5 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--batches", required=True)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-len-b", type=int, default=200)
    # fairseq-generate calls model.prepare_for_inference_ (weight norm removed, BeamableMM):
    # fairseq's fast path, used here at beam > 1. At beam 1 it fails in fairseq 0.12
    # (BeamableMM: "shape '[B, 1, -1]' is invalid"), so beam 1 runs without it by default.
    parser.add_argument(
        "--prepare",
        choices=("auto", "yes", "no"),
        default="auto",
        help="call model.prepare_for_inference_ (auto: when beam > 1)",
    )
    return parser.parse_args()


def load_generator(args: argparse.Namespace):
    """(models, SequenceGenerator) of the checkpoint, as fairseq-generate sets them up."""
    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator

    data_dir = os.path.dirname(os.path.abspath(args.ckpt))
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [args.ckpt], arg_overrides={"data": data_dir}
    )
    for model in models:
        model.eval()
        if args.prepare == "yes" or (args.prepare == "auto" and args.beam > 1):
            model.prepare_for_inference_(cfg)
    generator = SequenceGenerator(
        models,
        task.target_dictionary,
        beam_size=args.beam,
        max_len_a=0,
        max_len_b=args.max_len_b,
        min_len=1,
        normalize_scores=True,
        len_penalty=1.0,
        unk_penalty=0.0,
    )
    return models, generator


def translate(models, generator, batches) -> dict:
    """The batches through the generator, timed: seconds, CPU seconds, sentences, output tokens
    and each sentence's best hypothesis."""
    import torch

    hyps: list[list[int]] = []
    out_tokens = 0
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.no_grad():
        for src, lengths in batches:
            sample = {
                "id": torch.arange(src.size(0)),
                "net_input": {"src_tokens": src, "src_lengths": lengths},
            }
            for finalized in generator.generate(models, sample):
                best = finalized[0]["tokens"].tolist()
                hyps.append(best)
                out_tokens += len(best)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "sentences": len(hyps),
        "tokens": out_tokens,
        "hyps": hyps,
    }


def main() -> None:
    args = parse_args()

    import torch

    torch.set_num_threads(args.threads)
    models, generator = load_generator(args)
    batches = torch.load(args.batches, weights_only=True)
    print(json.dumps(translate(models, generator, batches)))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # reported, not hidden: the driver prints it as this side's result
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        sys.exit(3)
