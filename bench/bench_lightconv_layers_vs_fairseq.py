"""convseq's LightConvDecoderLayer against fairseq 0.12's, where the sequence is shorter than
the kernel (and beside it), output for output.

For each setting (lightweight and dynamic convolution, K 7 / 31, T 1 / 4 / 6 / 20 / 40; E 32,
conv 32, FFN 64, H 4, B 3, S 5 with one padded source row; weight softmax, GLU, dropout 0, fp32)
convseq's layer is built from a seed, its parameters moved off their initial values, and the same
state_dict is loaded with strict=True into fairseq's LightConvDecoderLayer, which runs in its own
process with bench/fairseq-venv's Python (bench/lightconv_layers_fairseq_side.py). Compared, as
the largest absolute difference over all outputs:

* train / eval: convseq's full (teacher-forced) forward against fairseq's, fairseq's layer in
  train and in eval mode (dropout 0);
* untrimmed: convseq's full forward with the dynamic convolution's trim_short_kernel off,
  against fairseq's eval forward (the size of fairseq's trim where T < K);
* steps: one position at a time through the incremental state, each side's;
* fairseq full vs steps: fairseq's own teacher-forced output against its own incremental one.

    python bench/bench_lightconv_layers_vs_fairseq.py [--json PATH]
    python bench/bench_lightconv_layers_vs_fairseq.py --dry-run   # convseq's side only
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import torch

from convseq.modules.lightconv_layer import LightConvDecoderLayer

# bench/, beside this script (on sys.path as a script)
from vs_fairseq_common import ROOT, fairseq_cases, machine_of_run, max_diff

SIDE = ROOT / "bench" / "lightconv_layers_fairseq_side.py"
SIZE = {"E": 32, "CONV": 32, "FFN": 64, "H": 4, "B": 3, "S": 5}
COLUMNS = ("train", "eval", "untrimmed", "steps", "fairseq full vs steps")


def settings(dry_run: bool) -> list[dict[str, Any]]:
    grid = [("dynamic", 7, 4)] if dry_run else itertools.product(
        ("lightweight", "dynamic"), (7, 31), (1, 4, 6, 20, 40)
    )  # fmt: skip
    return [{"conv_type": c, "K": k, "T": t, **SIZE} for c, k, t in grid]


def build(case: dict[str, Any], seed: int) -> tuple[LightConvDecoderLayer, dict[str, Any]]:
    """convseq's layer (parameters moved off their init) and its inputs."""
    torch.manual_seed(seed)
    layer = LightConvDecoderLayer(
        case["E"], case["CONV"], case["FFN"], case["K"], case["H"], conv_type=case["conv_type"]
    ).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    rows = case["B"]
    mask = torch.zeros(rows, case["S"], dtype=torch.bool)  # (B, S)
    mask[1, 3:] = True  # one padded source row
    inputs = {
        "x": torch.randn(case["T"], rows, case["E"]),  # (T, B, E)
        "encoder_out": torch.randn(case["S"], rows, case["E"]),  # (S, B, E)
        "mask": mask,
    }
    return layer, inputs


def convseq_side(layer: LightConvDecoderLayer, inputs: dict[str, Any]) -> dict[str, Any]:
    x, enc, mask = inputs["x"], inputs["encoder_out"], inputs["mask"]
    out: dict[str, Any] = {}
    with torch.no_grad():
        out["full"] = layer(x, enc, mask)[0]  # (T, B, E)
        trim = getattr(layer.conv, "trim_short_kernel", False)
        if trim:
            layer.conv.trim_short_kernel = False
        out["untrimmed"] = layer(x, enc, mask)[0]
        if trim:
            layer.conv.trim_short_kernel = True
        state: dict[str, Any] = {}
        steps = [layer(x[t : t + 1], enc, mask, state)[0] for t in range(x.size(0))]
        out["steps"] = torch.cat(steps)  # (T, B, E)
    return out


def compare(mine: dict[str, Any], theirs: dict[str, Any] | None) -> dict[str, float | None]:
    """One row (dry: convseq's one step at a time against its own untrimmed forward)."""
    if theirs is None:
        return {"steps": max_diff(mine["steps"], mine["untrimmed"])}
    return {
        "train": max_diff(mine["full"], theirs["train"]),
        "eval": max_diff(mine["full"], theirs["eval"]),
        "untrimmed": max_diff(mine["untrimmed"], theirs["eval"]),
        "steps": max_diff(mine["steps"], theirs["steps"]),
        "fairseq full vs steps": max_diff(theirs["eval"], theirs["steps"]),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'conv':<12}{'K':>3}{'T':>4}" + "".join(f"{c:>23}" for c in COLUMNS))
    for r in rows:
        case, diff = r["case"], r["diff"]
        cells = ["-" if diff.get(c) is None else f"{diff[c]:.1e}" for c in COLUMNS]
        print(
            f"{case['conv_type']:<12}{case['K']:>3}{case['T']:>4}"
            + "".join(f"{c:>23}" for c in cells)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the machine, the cases and their differences here")
    parser.add_argument("--dry-run", action="store_true", help="convseq's side only, one case")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    info = machine_of_run(args.threads)
    cases = settings(args.dry_run)
    built, mine = [], []
    for i, case in enumerate(cases):
        layer, inputs = build(case, args.seed + i)
        mine.append(convseq_side(layer, inputs))
        built.append({**case, **inputs, "state": layer.state_dict()})
    theirs = [None] * len(cases) if args.dry_run else fairseq_cases(SIDE, built, args.threads)
    rows = [{"case": c, "diff": compare(m, t)} for c, m, t in zip(cases, mine, theirs, strict=True)]
    if args.dry_run:
        print("dry run: convseq's one step at a time against its untrimmed forward (no fairseq)")
    print_table(rows)
    if args.json:
        result = {"machine": info, "dry_run": args.dry_run, "rows": rows}
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
