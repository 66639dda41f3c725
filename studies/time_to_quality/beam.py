"""Beam size and length penalty read on valid BLEU, with sentences per second, for one
checkpoint (by default a run's best.ckpt):

    python -m studies.time_to_quality.beam outputs/ttq/fast45_seed1 [--ckpt FILE]

Each setting translates the valid set once in its own `python run.py task=generate` process;
results are kept under `<run>/beam/`. Run it with nothing else running (the speeds).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from studies.time_to_quality.scoring import translate

FOLDER = "beam"
# (beam, lenpen): greedy, fairseq's defaults, and the length penalty on both sides at 5 and 10
SETTINGS = ((1, 1.0), (5, 0.6), (5, 1.0), (5, 1.4), (10, 0.6), (10, 1.0), (10, 1.4))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--ckpt", type=Path, help="default: <run>/checkpoints/best.ckpt")
    args = ap.parse_args()
    ckpt = args.ckpt or args.run / "checkpoints" / "best.ckpt"
    print("| gen.beam | gen.lenpen | valid BLEU | sentences/s |")
    print("|---|---|---|---|")
    for beam, lenpen in SETTINGS:
        out = args.run / FOLDER / f"beam{beam}_lenpen{lenpen:g}"
        result = translate(ckpt, out, "valid", beam=beam, lenpen=lenpen)
        speed = result["sentences"] / result["seconds"]
        print(f"| {beam} | {lenpen:g} | {result['scores']['bleu']:.2f} | {speed:.1f} |", flush=True)


if __name__ == "__main__":
    main()
