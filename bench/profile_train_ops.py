"""Where a training update's time goes, by kind of operation, in each precision, side by side.

Runs convseq's own Lightning loop (bench/bench_train.py's: the Multi30k recipe's model and
4000-token batches, callbacks and logging on, checkpoints and validation off) once per precision,
each in a fresh process, and records torch's profiler over `--updates` updates after `--warmup`.
Every operator's self CPU time is put in one bucket:

- gemm: the matrix products (addmm, mm, bmm, conv_tbc and oneDNN's kernels behind them)
- cast: dtype conversions and copies (to, _to_copy, copy_): what autocast adds
- dropout: the random masks (bernoulli_, uniform_, ...)
- loss: the fused loss's passes over the (tokens, vocabulary) logits (logsumexp, exp, sub, ...)
- optimiser: the NAG step and gradient norms (_foreach_*, norm, clamp)
- other: everything else (GLU, weight norm, attention's softmax, sums, index work)

The table gives milliseconds per update and the share of each bucket, then the top operators.
A bucket that does not shrink with bf16 is where the bf16 gain stops.

    CONVSEQ_DATA_ROOT=../shared/data python bench/profile_train_ops.py
    python bench/profile_train_ops.py --precisions 32-true bf16-mixed --updates 8 --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import machine, machine_line  # noqa: E402  (bench/, beside this script)

# Operators by name (torch's profiler keys); a name in no set is "other".
BUCKETS: dict[str, set[str]] = {
    "gemm": {"aten::addmm", "aten::addmm_", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::conv_tbc",
             "aten::matmul", "aten::linear", "aten::mkldnn_linear", "aten::_mkldnn_matmul"},
    "cast": {"aten::to", "aten::_to_copy", "aten::copy_"},
    "dropout": {"aten::bernoulli_", "aten::uniform_", "aten::dropout", "aten::native_dropout"},
    "loss": {"aten::logsumexp", "aten::exp", "aten::exp_", "aten::sub", "aten::sub_",
             "aten::log_softmax", "aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::gather", "aten::nll_loss"},
    "optimiser": {"aten::norm", "aten::linalg_vector_norm", "aten::clamp", "aten::clamp_"},
}  # fmt: skip


# From the gradients' normalisation to the end of the update: normalise, clip, the NAG step.
OPTIMISER_SCOPE = "convseq::optimiser"


def bucket(name: str, scopes: tuple[str, ...] = ()) -> str:
    """The bucket of operator `name` run inside the profiler scopes `scopes` (outermost first):
    anything inside OPTIMISER_SCOPE is the optimiser's (torch's own `Optimizer.step#...` scope
    cannot say so: Lightning runs the forward and backward as a closure inside it)."""
    if name.startswith("aten::_foreach_") or OPTIMISER_SCOPE in scopes:
        return "optimiser"
    return next((kind for kind, names in BUCKETS.items() if name in names), "other")


def self_times(events: list[Any]) -> list[dict[str, Any]]:
    """Self CPU time and calls per (operator, bucket), from the profiler's event tree."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for e in events:
        if e.self_cpu_time_total <= 0:
            continue
        scopes, parent = [], e.cpu_parent
        while parent is not None:
            scopes.append(parent.name)
            parent = parent.cpu_parent
        key = (e.name, bucket(e.name, tuple(reversed(scopes))))
        row = rows.setdefault(key, {"name": key[0], "bucket": key[1], "self_us": 0.0, "count": 0})
        row["self_us"] += e.self_cpu_time_total
        row["count"] += 1
    return sorted(rows.values(), key=lambda r: -r["self_us"])


def summarise(ops: list[dict[str, Any]], updates: int) -> dict[str, Any]:
    """Milliseconds per update by bucket and their shares, from (name, self_us, count) rows."""
    totals = {kind: 0.0 for kind in (*BUCKETS, "other")}
    for op in ops:
        totals[op["bucket"]] += op["self_us"] / 1000 / updates
    whole = sum(totals.values())
    return {
        "ms_per_update": totals,
        "total_ms_per_update": whole,
        "share": {k: (v / whole if whole else 0.0) for k, v in totals.items()},
    }


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Profile the Lightning loop at `args.child` precision; the operators' self times."""
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.callbacks import ModelCheckpoint

    from bench_train import build, compose_cfg
    from convseq.training.build import build_callbacks, build_trainer

    torch.set_num_threads(args.threads)
    warmup, updates = args.warmup, args.updates

    class Window(pl.Callback):
        def __init__(self) -> None:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.scope = None

        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            if batch_idx == warmup:
                self.prof.start()

        def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
            # callbacks run before the module's own hook, which normalises the gradients
            self.scope = torch.profiler.record_function(OPTIMISER_SCOPE)
            self.scope.__enter__()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            if self.scope is not None:
                self.scope.__exit__(None, None, None)
                self.scope = None
            if batch_idx == warmup + updates - 1:
                self.prof.stop()

    with tempfile.TemporaryDirectory(prefix="convseq-prof-") as tmp:
        cfg = compose_cfg(args, tmp)
        trainer_cfg = dataclasses.replace(
            cfg.trainer,
            precision=args.child,
            max_epochs=1,
            limit_train_batches=warmup + updates,
            limit_val_batches=0,
            num_sanity_val_steps=0,
        )
        cfg = dataclasses.replace(cfg, trainer=trainer_cfg)
        module, dm = build(cfg)
        cbs = build_callbacks(cfg, Path(tmp) / "checkpoints")
        cbs.pop("best")
        window = Window()
        trainer = build_trainer(cfg, [*cbs.values(), window], Path(tmp))
        # no checkpointing: Lightning's default ModelCheckpoint goes too (no key of the config)
        trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, ModelCheckpoint)]
        trainer.fit(module, datamodule=dm)
    return {"precision": args.child, "ops": self_times(window.prof.events())}


def print_table(results: list[dict[str, Any]], updates: int, top: int) -> None:
    """The buckets side by side (ms per update, share), then each precision's top operators."""
    sums = [summarise(r["ops"], updates) for r in results]
    head = f"{'bucket':10s}" + "".join(f" {r['precision']:>22s}" for r in results)
    print("\n" + head)
    for kind in (*BUCKETS, "other"):
        cells = "".join(
            f" {s['ms_per_update'][kind]:9.1f} ms ({s['share'][kind]:5.1%})" for s in sums
        )
        print(f"{kind:10s}{cells}")
    print(f"{'total':10s}" + "".join(f" {s['total_ms_per_update']:9.1f} ms {'':8s}" for s in sums))
    for r in results:
        print(f"\ntop operators, {r['precision']} (self CPU ms per update):")
        for op in r["ops"][:top]:
            ms = op["self_us"] / 1000 / updates
            print(f"  {ms:8.1f}  {op['bucket']:9s} {op['name']}")


CHILD_ARGS = ("model", "max_tokens", "warmup", "updates", "threads", "cache_dir")


def main() -> int:
    from bench_train import DATA_ROOT, cache_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precisions", nargs="+", default=["32-true", "bf16-mixed"])
    ap.add_argument("--model", default="fconv_iwslt_de_en")
    ap.add_argument("--max-tokens", type=int, default=4000)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--updates", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--cache-dir", default=None, help="default: as run.py (CONVSEQ_CACHE, ...)")
    ap.add_argument("--json", help="also write the machine, buckets and operators here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.cache_dir = cache_dir(args.cache_dir)
    if args.child:
        Path(args.result).write_text(json.dumps(child(args)))
        return 0
    if not (DATA_ROOT / "multi30k" / "train.de").is_file():
        print(f"skipped: Multi30k not found at {DATA_ROOT / 'multi30k'}")
        return 0
    import torch

    torch.set_num_threads(args.threads)
    info = machine()
    print(machine_line(info))
    print(f"model {args.model}, max_tokens {args.max_tokens}, {args.warmup} warm-up + "
          f"{args.updates} profiled updates, each precision in a fresh process")  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for precision in args.precisions:
            out = Path(tmp) / f"{precision}.json"
            argv = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in CHILD_ARGS]
            subprocess.run(
                [sys.executable, __file__, *argv, "--child", precision, "--result", str(out)],
                check=True,
            )
            results.append(json.loads(out.read_text()))
    print_table(results, args.updates, args.top)
    if args.json:
        summary = [
            {**summarise(r["ops"], args.updates), "precision": r["precision"]} for r in results
        ]
        figures = {"machine": info, "updates": args.updates, "buckets": summary, "runs": results}
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
