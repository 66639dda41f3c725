"""convseq's LightweightConv1dTBC and DynamicConv1dTBC against fairseq 0.12's, output for output.

For each setting (K 3 / 7 / 31, causal and centred padding, weight softmax on and off, T 20 / 40, and K 7 / 31
with T 1 / 4 / 6, shorter than the kernel;
H 4, C 64, B 5, fp32, eval mode) convseq's layer is built from a seed, its parameters moved off
their initial values (biases included), and the same state_dict is loaded with strict=True into
fairseq's layer, which runs in its own process with bench/fairseq-venv's Python
(bench/conv_layers_fairseq_side.py; convseq never imports fairseq). Compared, as the largest
absolute difference over all outputs:

* unfold / band: the full forward in each form (fairseq's _forward_unfolded / _forward_expanded);
* model: the full forward of the convolution each toolkit's LightConv layers build (fairseq:
  the LightweightConv factory, band form on CPU, or DynamicConv_scripatable, always unfold;
  convseq: its layer with trim_short_kernel for dynamic); untrimmed: convseq's band form
  without trim_short_kernel against fairseq's model column (the size of fairseq's trim);
* steps: causal padding, one position at a time through the incremental state;
* chunks: causal padding, several positions at once (3, then 5, alternately); both columns are
  against fairseq's one-step-at-a-time output (the answer), fairseq's is the error it raises
  (fairseq issue 3908) where it raises one.

fairseq's dynamic unfold form differs from its own band form where K > T with causal padding and
weight softmax: it keeps the last T taps and normalises over those alone. fairseq's LightConv
model builds DynamicConv_scripatable, which always takes that form for the full forward (training
and eval); its incremental form normalises over all K taps.

    python bench/bench_conv_layers_vs_fairseq.py [--json PATH]
    python bench/bench_conv_layers_vs_fairseq.py --dry-run   # convseq's side only, a tiny case

The dry run compares convseq's forms with its own unfold form (no fairseq needed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from convseq.modules.dynamic_conv import DynamicConv1dTBC
from convseq.modules.lightweight_conv import LightweightConv1dTBC

# bench/, beside this script (on sys.path as a script)
from vs_fairseq_common import ROOT, fairseq_cases, machine_of_run, max_diff

SIDE = ROOT / "bench" / "conv_layers_fairseq_side.py"
LAYERS = ("lightweight", "dynamic")
CHUNKS = (3, 5)  # several steps at once: 3 positions, then 5, alternately
COLUMNS = ("unfold", "band", "model", "untrimmed", "steps", "chunks convseq", "chunks fairseq")


def settings(dry_run: bool) -> list[dict[str, Any]]:
    """The cases: every layer x K x padding x weight softmax x T (one tiny case a layer dry)."""
    if dry_run:
        grid = itertools.product(LAYERS, (3,), (True,), (True,), (6,))
        size = {"H": 2, "C": 8, "B": 2}
    else:
        grid = itertools.chain(
            itertools.product(LAYERS, (3, 7, 31), (True, False), (False, True), (20, 40)),
            # shorter than the kernel: where fairseq's model trims the dynamic kernels
            itertools.product(LAYERS, (7, 31), (True, False), (False, True), (1, 4, 6)),
        )
        size = {"H": 4, "C": 64, "B": 5}
    keys = ("layer", "K", "causal", "softmax", "T")
    return [dict(zip(keys, values, strict=True), **size) for values in grid]


def layer_kwargs(case: dict[str, Any]) -> dict[str, Any]:
    """Constructor arguments, the same names in both toolkits."""
    k = case["K"]
    kwargs = {
        "input_size": case["C"],
        "kernel_size": k,
        "padding_l": k - 1 if case["causal"] else (k - 1) // 2,
        "num_heads": case["H"],
        "weight_softmax": case["softmax"],
        "bias": True,
    }
    if case["layer"] == "dynamic":
        kwargs["conv_bias"] = True
    return kwargs


def build(case: dict[str, Any], seed: int) -> nn.Module:
    """convseq's layer, its parameters (zero biases too) moved off their initial values."""
    torch.manual_seed(seed)
    cls = LightweightConv1dTBC if case["layer"] == "lightweight" else DynamicConv1dTBC
    layer = cls(**layer_kwargs(case)).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer


def chunk_sizes(length: int) -> list[int]:
    sizes: list[int] = []
    while sum(sizes) < length:
        sizes.append(min(CHUNKS[len(sizes) % 2], length - sum(sizes)))
    return sizes


def incremental(layer: nn.Module, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """The layer fed `sizes` positions at a time through one incremental state: (T, B, C)."""
    state: dict[str, object] = {}
    outs, start = [], 0
    for n in sizes:
        outs.append(layer(x[start : start + n], incremental_state=state))  # (n, B, C)
        start += n
    return torch.cat(outs)


def convseq_side(case: dict[str, Any], layer: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """Every form's output of convseq's layer."""
    out: dict[str, Any] = {}
    with torch.no_grad():
        out["unfold"] = layer(x, unfold=True)  # (T, B, C)
        out["band"] = layer(x, unfold=False)  # (T, B, C)
        # what convseq's LightConv layers compute (make_conv: trim_short_kernel for dynamic)
        layer.trim_short_kernel = case["layer"] == "dynamic"
        out["model"] = layer(x)  # (T, B, C)
        layer.trim_short_kernel = False
        if case["causal"]:
            out["steps"] = incremental(layer, x, [1] * x.size(0))
            out["chunked"] = incremental(layer, x, chunk_sizes(x.size(0)))
    return out


def compare(mine: dict[str, Any], theirs: dict[str, Any] | None) -> dict[str, Any]:
    """One row: the largest absolute differences (dry: convseq's forms against its unfold)."""
    ref = mine["unfold"] if theirs is None else theirs["unfold"]
    other = {"band": mine["unfold"], "steps": mine["unfold"]} if theirs is None else theirs
    row: dict[str, Any] = {"unfold": None if theirs is None else max_diff(mine["unfold"], ref)}
    row["band"] = max_diff(mine["band"], other["band"])
    row["model"] = max_diff(mine["model"], ref if theirs is None else theirs["model"])
    if theirs is not None:  # the size of the trim: convseq's untrimmed output against fairseq's
        row["untrimmed"] = max_diff(mine["band"], theirs["model"])
    if "steps" not in mine:
        return row
    row["steps"] = max_diff(mine["steps"], other["steps"])
    steps = ref if theirs is None else theirs["steps"]  # the answer: one step at a time
    row["chunks convseq"] = max_diff(mine["chunked"], steps)
    if theirs is not None:
        if "chunked_error" in theirs:
            row["chunks fairseq"] = theirs["chunked_error"]
        else:
            row["chunks fairseq"] = max_diff(theirs["chunked"], steps)
    return row


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value.split(":")[0]  # the error's type; the message is printed under the table
    return f"{value:.1e}" if value else "0"


def print_table(rows: list[dict[str, Any]]) -> None:
    head = f"{'layer':<12}{'K':>3} {'padding':<8}{'softmax':<8}{'T':>3}"
    print(head + "".join(f"{c:>16}" for c in COLUMNS))
    errors: set[str] = set()
    for r in rows:
        case = r["case"]
        padding = "causal" if case["causal"] else "centred"
        softmax = "on" if case["softmax"] else "off"
        line = f"{case['layer']:<12}{case['K']:>3} {padding:<8}{softmax:<8}{case['T']:>3}"
        print(line + "".join(f"{cell(r['diff'].get(c)):>16}" for c in COLUMNS))
        errors |= {v for v in r["diff"].values() if isinstance(v, str)}
    for error in sorted(errors):
        print(f"fairseq, several steps at once: {error}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the machine, the cases and their differences here")
    parser.add_argument("--dry-run", action="store_true", help="convseq's side only, tiny")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    info = machine_of_run(args.threads)
    cases = settings(args.dry_run)
    built, mine = [], []
    for i, case in enumerate(cases):
        layer = build(case, args.seed + i)
        torch.manual_seed(10_000 + args.seed + i)
        x = torch.randn(case["T"], case["B"], case["C"])  # (T, B, C)
        mine.append(convseq_side(case, layer, x))
        built.append(
            {**case, "kwargs": layer_kwargs(case), "state": layer.state_dict(), "x": x,
             "chunks": chunk_sizes(case["T"])}
        )  # fmt: skip
    theirs = [None] * len(cases) if args.dry_run else fairseq_cases(SIDE, built, args.threads)
    rows = [
        {"case": case, "diff": compare(m, t)}
        for case, m, t in zip(cases, mine, theirs, strict=True)
    ]
    if args.dry_run:
        print("dry run: convseq's forms against its own unfold form (fairseq not run)")
    print_table(rows)
    if args.json:
        result = {"machine": info, "dry_run": args.dry_run, "chunks": CHUNKS, "rows": rows}
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
