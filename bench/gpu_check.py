"""Check and measure convseq on NVIDIA GPUs; prints one table (and `--json PATH`).

What it does, cheapest checks first, so that a run cut short by a time limit has the checks
(docs/gpu.md explains each row):

1. Compares training on the device with training on the CPU (`bench/gpu_parity.py`): fp32,
   bf16-mixed and 16-mixed runs of `--parity-updates` updates with dropout 0 against a CPU fp32
   run of the same seed and batches: the first update's gradient norm, the loss of the last
   update and the parameters' change, each within a tolerance per precision.
2. Trains the `fconv_iwslt_de_en` preset with the Multi30k recipe (`experiment=multi30k_fconv`,
   or `data=toy` when `<data root>/multi30k/` is absent) for `--updates` updates in fp32,
   bf16-mixed and 16-mixed through `convseq.tasks.train.train` (`bench/gpu_train.py`): target
   tokens per second, peak GPU memory; for 16-mixed the skipped updates and the final loss
   scale. `test_device` in the fp32 run's summary.json must name the GPU.
3. Translates the first `--sentences` test sentences with beam 5 on the GPU and on the CPU from
   the fp32 run's best checkpoint: the hypotheses must agree (`bench/gpu_translate.py`). Then
   sentences per second at beam 1 and 5, and beam 5 with `gen.precision=bf16`.
4. `python run.py` in a subprocess, SIGTERM after a third of its updates: exit 75 and
   last.ckpt, then `resume=true` finishes with the uninterrupted run's loss (`bench/gpu_runpy.py`).
5. DDP over every visible GPU when there are several (`trainer=ddp`, a subprocess).
6. The other model family (`bench/gpu_lightconv.py`): the `lightconv_iwslt_de_en` preset
   (DynamicConv) trained for `--lightconv-updates` updates in each precision (target tokens per
   second, peak memory), then beam 5 from its fp32 checkpoint on the GPU and on the CPU: the
   hypotheses must agree; sentences per second at beam 5, and with `gen.precision=bf16`.
7. Trains the big `fconv_wmt_en_de` preset for `--big-updates` updates on the same corpus in
   each precision: target tokens per second, peak memory.

    python bench/gpu_check.py                             # sized for under 8 minutes on one GPU
    python bench/gpu_check.py --updates 500 --json gpu.json --out runs/gpu
    python bench/gpu_check.py --dry-run                   # the same code path on the CPU, tiny
    python bench/gpu_check.py --dry-run --skip resume --skip ddp   # without the run.py parts

Exit status: 0 when every check passes, 1 when one fails, 2 without a CUDA device (and no
`--dry-run`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from gpu_common import Plan, Report, compose, corpus_overrides, environment, timed
from gpu_lightconv import lightconv_measurements
from gpu_parity import FAULTS
from gpu_runpy import ddp_check, resume_check
from gpu_train import big_measurements, parity_checks, test_device_check, training_measurements
from gpu_translate import beam_measurements, test_sources
from machine import machine_line  # bench/, beside this script (on sys.path as a script)

# --only: one part alone (with the training run it needs), for a quick look or the tests;
# --skip: leave parts out (the tests' dry run leaves out the two that start run.py subprocesses)
ONLY = ("parity", "resume", "ddp", "lightconv", "big")
SKIPPABLE = ("resume", "ddp", "lightconv", "big")


def table(report: Report, corpus: str, out: str) -> str:
    env = report.env
    mode = "DRY RUN on the CPU: tiny sizes, not GPU figures" if env["dry_run"] else "GPU"
    head = [
        machine_line(report.machine),
        f"convseq GPU check ({mode})",
        f"device: {env['device']} | CUDA {env['cuda']} | cuDNN {env['cudnn']}",
        f"corpus: {corpus}; {env['updates']} updates a run; outputs: {out}",
        "",
    ]
    width = max(len(r[0]) for r in report.rows)
    vwidth = max(len(r[1]) for r in report.rows)
    lines = [f"{'check':<{width}}  {'result':<{vwidth}}  status"]
    lines.append("-" * len(lines[0]))
    lines += [f"{n:<{width}}  {v:<{vwidth}}  {s}" for n, v, s in report.rows]
    verdict = "all checks passed" if report.ok else "SOME CHECKS FAILED"
    return "\n".join([*head, *lines, "", verdict])


def budget_lines(report: Report) -> str:
    """Each part's wall seconds (--budget)."""
    total = sum(report.budget.values())
    lines = [f"  {part:<10} {s:7.1f} s" for part, s in report.budget.items()]
    return "\n".join(["time by part:", *lines, f"  {'all':<10} {total:7.1f} s"])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="the same path on the CPU, tiny sizes")
    p.add_argument("--updates", type=int, default=300, help="updates per training run")
    p.add_argument(
        "--parity-updates", type=int, default=20, help="updates of each run compared with the CPU"
    )
    p.add_argument(
        "--only",
        choices=ONLY,
        help="one part alone: parity (no timings); resume, ddp, lightconv, big (after the fp32 "
        "run; lightconv trains its own)",
    )
    p.add_argument(
        "--skip",
        action="append",
        choices=SKIPPABLE,
        default=[],
        help="leave this part out (repeatable): its rows are not in the table",
    )
    p.add_argument(
        "--inject",
        choices=sorted(FAULTS),
        help="plant a fault in the device's parity runs (the check must then fail)",
    )
    p.add_argument(
        "--data-root",
        help="folder holding multi30k/ (default $CONVSEQ_DATA_ROOT, "
        "else ../shared/data); toy corpus when absent",
    )
    p.add_argument("--sentences", type=int, default=200, help="test sentences translated")
    p.add_argument("--big-updates", type=int, default=40, help="updates of each big-preset run")
    p.add_argument(
        "--lightconv-updates", type=int, default=100, help="updates of each LightConv run"
    )
    p.add_argument(
        "--resume-updates", type=int, default=30, help="updates of the SIGTERM/resume run"
    )
    p.add_argument("--ddp-updates", type=int, default=100, help="updates of the DDP run")
    p.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="report, but do not fail on, CPU/GPU hypotheses that differ",
    )
    p.add_argument(
        "--out",
        help="keep the run folders under this folder (default: a temporary "
        "folder, deleted at the end)",
    )
    p.add_argument("--json", help="also write the figures to this JSON file (after each part)")
    p.add_argument("--budget", action="store_true", help="print each part's seconds")
    args = p.parse_args(argv)
    counts = ("updates", "parity_updates", "sentences", "big_updates", "lightconv_updates")
    for key in (*counts, "ddp_updates"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be at least 1")
    if args.resume_updates < 3:
        p.error("--resume-updates must be at least 3 (SIGTERM after a third of them)")
    return args


def check_all(
    args: argparse.Namespace, plan: Plan, out: Path, save: Callable[[Report], None]
) -> tuple[Report, str]:
    """The parts in order; `save` after each (the JSON so far)."""
    report = Report(environment(plan))
    base, corpus = corpus_overrides(args, plan, out)
    report.figures["corpus"] = corpus
    only = args.only
    if only in (None, "parity"):
        with timed(report, "parity"):
            parity_checks(report, plan, base, out)
        save(report)
    if only == "parity":
        return report, corpus
    if only in (None, "ddp"):  # the DDP run's one-device figure is the fp32 run's
        with timed(report, "train"):
            fp32 = training_measurements(report, plan, base, out)
            test_device_check(report, plan, fp32["summary"])
        save(report)
    if only is None:
        summary = fp32["summary"]
        ckpt = summary.get("best_checkpoint") or summary["last_checkpoint"]
        lines = test_sources(compose(base, out / "unused"), plan.beam_sentences)
        with timed(report, "translate"):
            beam_measurements(report, plan, ckpt, lines, args.allow_mismatch)
        save(report)
    if only in (None, "resume") and "resume" not in args.skip:
        with timed(report, "resume"):
            resume_check(report, plan, base, out)
        save(report)
    if only in (None, "ddp") and "ddp" not in args.skip:
        with timed(report, "ddp"):
            ddp_check(report, plan, base, out, fp32)
        save(report)
    if only in (None, "lightconv") and "lightconv" not in args.skip:
        lines = test_sources(compose(base, out / "unused"), plan.beam_sentences)
        with timed(report, "lightconv"):
            lightconv_measurements(report, plan, base, out, lines, args.allow_mismatch)
        save(report)
    if only in (None, "big") and "big" not in args.skip:
        with timed(report, "big"):
            big_measurements(report, plan, base, out)
        save(report)
    return report, corpus


@contextmanager
def output_folder(out: str | None) -> Iterator[Path]:
    """A fresh folder under --out (kept), or a temporary one (deleted)."""
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        # a fresh subfolder: train() refuses a folder that already holds a run
        yield Path(tempfile.mkdtemp(prefix="gpu-check-", dir=out)).absolute()
        return
    with tempfile.TemporaryDirectory(prefix="convseq-gpu-check-") as tmp:
        yield Path(tmp)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device: this check needs an NVIDIA GPU and a CUDA build of torch "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False). "
            "`python bench/gpu_check.py --dry-run` runs the same code path on the CPU with tiny "
            "sizes.",
            file=sys.stderr,
        )
        return 2
    plan = Plan.from_args(args)
    t0 = time.perf_counter()

    def save(report: Report) -> None:
        report.figures["seconds"] = time.perf_counter() - t0
        if args.json:
            text = json.dumps(report.as_json(), indent=2) + "\n"
            Path(args.json).write_text(text, encoding="utf-8")

    with output_folder(args.out) as out:
        report, corpus = check_all(args, plan, out, save)
        save(report)
        kept = str(out) if args.out else f"{out} (deleted at exit; --out keeps them)"
        print("\n" + table(report, corpus, kept), flush=True)
    if args.budget:
        print(budget_lines(report), flush=True)
    print(f"gpu_check: {report.figures['seconds']:.0f} s in all", flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
