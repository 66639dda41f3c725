"""The recipe's model translated faster: test2016 BLEU and sentences per second in each
`gen.precision`, side by side (beam 5, the run's best checkpoint).

    python -m studies.time_to_quality.generation outputs/ttq/fast_seed1 [--repeats 3]

Each repeat runs every precision once, in a fresh `python run.py task=generate` process,
rotating which goes first; sentences per second are the medians over the repeats (BLEU does not
change between repeats). Run it with nothing else running.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from studies.time_to_quality.scoring import translate

PRECISIONS = ("fp32", "bf16", "int8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    ckpt = args.run / "checkpoints" / "best.ckpt"
    speeds: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    bleu: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            order = PRECISIONS[r % 3 :] + PRECISIONS[: r % 3]
            for p in order:
                result = translate(ckpt, Path(tmp) / f"{p}{r}", precision=p)
                speeds[p].append(result["sentences"] / result["seconds"])
                bleu[p] = result["scores"]["bleu"]
    print("| gen.precision | test BLEU | sentences/s (median) | speed vs fp32 |")
    print("|---|---|---|---|")
    base = statistics.median(speeds["fp32"])
    for p in PRECISIONS:
        s = statistics.median(speeds[p])
        print(f"| {p} | {bleu[p]:.2f} | {s:.1f} | {s / base:.2f}x |")


if __name__ == "__main__":
    main()
