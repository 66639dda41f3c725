"""NAG's step, per parameter against multi-tensor (`torch._foreach_*`), side by side.

Builds a model preset's parameters (conf/model/<preset>.yaml, random gradients), then times
`optimizer.step()` of `convseq.optim.NAG` with `foreach=False` (one parameter at a time: four
aten ops per parameter, a kernel launch each on a GPU) and `foreach=True` (four ops per device
and dtype), alternating the two over `--rounds` rounds, and counts the aten ops of one step.
On a CPU the multi-tensor ops loop over the tensors inside one call, so the gain is the Python
and dispatch overhead; on a GPU it is the launches.

    python bench/bench_optim_step.py                                 # fconv_iwslt_de_en, CPU
    python bench/bench_optim_step.py --preset fconv_wmt_en_de --device cuda --json out.json
    python bench/bench_optim_step.py --dry-run                       # tiny, for the test suite
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from convseq.common.specials import PAD_ID  # noqa: E402
from convseq.models.family import build_model, preset_config  # noqa: E402
from convseq.optim.nag import NAG  # noqa: E402
from machine import machine, machine_line  # noqa: E402  (bench/, beside this script)

CONF = Path(__file__).resolve().parents[1] / "conf" / "model"


class OpCount(TorchDispatchMode):
    """Counts the aten ops run inside it (the profiler's own markers excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.overloadpacket.__name__.startswith("_record_function"):
            self.count += 1
        return func(*args, **(kwargs or {}))


def model_params(preset: str, vocab: int, device: str) -> list[torch.nn.Parameter]:
    """The preset's parameters with a random gradient each."""
    cfg = preset_config(CONF / f"{preset}.yaml")
    params = list(build_model(cfg, vocab, vocab, PAD_ID).to(device).parameters())
    g = torch.Generator(device="cpu").manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(device) * 1e-3
    return params


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_steps(opt: NAG, steps: int, device: str) -> float:
    """Milliseconds per step over `steps` steps."""
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        opt.step()
    sync(device)
    return (time.perf_counter() - start) * 1e3 / steps


def run(preset: str, vocab: int, device: str, rounds: int, steps: int) -> dict[str, Any]:
    params = model_params(preset, vocab, device)
    opts = {
        name: NAG([p.detach().clone().requires_grad_() for p in params], lr=0.25, momentum=0.99,
                  foreach=foreach)
        for name, foreach in (("per_parameter", False), ("foreach", True))
    }  # fmt: skip
    ops: dict[str, int] = {}
    for name, opt in opts.items():
        for p, src in zip(opt.param_groups[0]["params"], params):
            p.grad = src.grad.clone()
        opt.step()  # the first step makes the buffers
        with OpCount() as counter:
            opt.step()
        ops[name] = counter.count
    times: dict[str, list[float]] = {name: [] for name in opts}
    for _ in range(rounds):  # alternating, so that drift of the machine hits both
        for name, opt in opts.items():
            times[name].append(time_steps(opt, steps, device))
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {
        "preset": preset,
        "device": device,
        "parameters": len(params),
        "elements": sum(p.numel() for p in params),
        "ops_per_step": ops,
        "ms_per_step": medians,
        "ms_runs": times,
        "speedup": medians["per_parameter"] / medians["foreach"],
    }


def table(result: dict[str, Any]) -> str:
    ms, ops = result["ms_per_step"], result["ops_per_step"]
    return "\n".join(
        [
            f"NAG step, {result['preset']} ({result['parameters']} tensors, "
            f"{result['elements'] / 1e6:.2f}M values), {result['device']}",
            "",
            "| NAG | aten ops per step | ms per step (median) |",
            "|---|---|---|",
            f"| per parameter | {ops['per_parameter']} | {ms['per_parameter']:.2f} |",
            f"| foreach | {ops['foreach']} | {ms['foreach']:.2f} |",
            "",
            f"foreach: {result['speedup']:.2f}x the per-parameter step's speed",
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="fconv_iwslt_de_en")
    ap.add_argument("--vocab", type=int, default=8000, help="source and target dictionary size")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds (median)")
    ap.add_argument("--steps", type=int, default=20, help="steps timed per round")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--dry-run", action="store_true", help="the toy preset, 2 rounds of 2 steps")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.preset, args.vocab, args.rounds, args.steps = "fconv_toy", 50, 2, 2
    info = machine()
    print(machine_line(info), flush=True)
    result = run(args.preset, args.vocab, args.device, args.rounds, args.steps)
    result["machine"] = info
    print(table(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
