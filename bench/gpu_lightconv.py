"""The LightConv part of bench/gpu_check.py: the other model family on the device.

The `lightconv_iwslt_de_en` preset (DynamicConv, fairseq 0.12's) is trained on the check's
corpus for `--lightconv-updates` updates in each precision through `convseq.tasks.train.train`
(target tokens per second, peak GPU memory; the same runs as the fconv preset's), then its fp32
checkpoint translates the test sentences with beam 5 on the device and on the CPU: the
hypotheses must agree (near-ties forgiven, as for fconv), a check. Sentences per second at beam
5, and beam 5 with `gen.precision=bf16` against fp32, are measurements. The dry run divides the
preset's widths by the big preset's divisor (its 7 + 6 layers and kernels kept).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from convseq.common.tf32 import set_tf32
from gpu_common import (
    FP32,
    LABEL,
    LIGHTCONV_PRESET,
    PRECISIONS_ALL,
    Plan,
    Report,
    compose,
    run_overrides,
    skipped_why,
    threads,
    without_model,
)
from gpu_parity import beam_agreement
from gpu_train import describe_training, train_run, training_figures
from gpu_translate import BEAM_BATCH, bf16_unsupported, timed_translate, translate

# the widths the dry run divides (the decoder's are the preset's own, not derived)
WIDTHS = (
    "encoder_embed_dim",
    "encoder_ffn_embed_dim",
    "decoder_embed_dim",
    "decoder_ffn_embed_dim",
)


def lightconv_overrides(shrink: int, out: Path) -> list[str]:
    """`model=lightconv_iwslt_de_en`, every width divided by `shrink` (at least 8)."""
    overrides = [f"model={LIGHTCONV_PRESET}"]
    if shrink <= 1:
        return overrides
    model = compose(overrides, out).model
    for key in WIDTHS:
        overrides.append(f"model.{key}={max(int(getattr(model, key)) // shrink, 8)}")
    return overrides


def lightconv_measurements(
    report: Report, plan: Plan, base: list[str], out: Path, lines: list[str], allow_mismatch: bool
) -> None:
    """The LightConv preset trained in each precision, then translated (module docstring)."""
    set_tf32(True)
    model = lightconv_overrides(plan.big_shrink, out / "unused")
    figures: dict[str, Any] = {
        "preset": LIGHTCONV_PRESET,
        "updates": plan.lightconv_updates,
        "width_divisor": plan.big_shrink,
    }
    report.figures["lightconv"] = figures
    fp32: dict[str, Any] | None = None
    for precision in PRECISIONS_ALL:
        name = f"lightconv train {LABEL[precision]}"
        if precision not in plan.precisions:
            figures[LABEL[precision]] = {"skipped": skipped_why(precision)}
            report.skip(name, skipped_why(precision))
            continue
        print(f"gpu_check: {LIGHTCONV_PRESET}, {LABEL[precision]}", flush=True)
        overrides = [
            *without_model(base),
            *model,
            *run_overrides(plan.device, precision, plan.lightconv_updates, False),
            "trainer.limit_val_batches=2",  # validation is not what is measured here
        ]
        run = train_run(compose(overrides, out / f"lightconv-{LABEL[precision]}"), plan.device)
        f = training_figures(run)
        f["params_m"] = run["params"] / 1e6
        figures[LABEL[precision]] = f
        report.row(name, f"{describe_training(f)}, {f['params_m']:.1f}M params")
        if precision == FP32:
            fp32 = run
    if fp32 is not None:
        summary = fp32["summary"]
        ckpt = summary.get("best_checkpoint") or summary["last_checkpoint"]
        # the dry run translates on one thread (training sets its own): on a busy CPU two
        # spinning threads made the untrained model's 200-step searches ~10x slower
        with threads(1 if plan.dry_run else None):
            figures["beam"] = lightconv_beam(report, plan, ckpt, lines, allow_mismatch)


def lightconv_beam(
    report: Report, plan: Plan, ckpt: str, lines: list[str], allow_mismatch: bool
) -> dict[str, Any]:
    """Beam 5 on the device against the CPU (a check), its speed, and bf16 beside fp32."""
    from convseq import Translator

    print(f"gpu_check: LightConv beam 5 on {len(lines)} sentences, CPU and {plan.device}")
    reference = Translator.from_checkpoints(ckpt).translate_records(
        lines, beam=5, nbest=2, batch_size=BEAM_BATCH, max_tokens=None
    )
    on_device = Translator.from_checkpoints(ckpt).to(plan.device)
    hypotheses = translate(on_device, lines, beam=5)  # also the device's warm-up
    agreement = beam_agreement(reference, hypotheses)
    speed = timed_translate(on_device, lines, 5, plan.device)[1]
    figures: dict[str, Any] = {
        "sentences": len(lines),
        **agreement,
        "share": agreement["identical"] / len(lines),
        "beam5_sent_per_s": speed,
    }
    ok = agreement["mismatched"] == 0 or allow_mismatch
    value = (
        f"{agreement['identical']}/{len(lines)} identical, {agreement['ties']} near-ties "
        f"(gap < {agreement['margin']:g}), {agreement['mismatched']} mismatched"
    )
    allowed = " (allowed)" if agreement["mismatched"] and allow_mismatch else ""
    report.row(f"lightconv beam 5 {plan.device} vs CPU", value + allowed, ok)
    report.row(f"lightconv translate beam 5, batch {BEAM_BATCH}", f"{speed:,.1f} sent/s")

    name = "lightconv beam 5, gen.precision=bf16"
    why = bf16_unsupported(plan.device)
    if why:
        figures["bf16"] = {"skipped": why}
        report.skip(name, why)
        return figures
    bf16 = Translator.from_checkpoints(ckpt).to(plan.device).with_precision("bf16", plan.device)
    translate(bf16, lines[:BEAM_BATCH], beam=5)  # warm-up
    hyps, bf16_speed = timed_translate(bf16, lines, 5, plan.device)
    same = sum(a == b for a, b in zip(hyps, hypotheses, strict=True))
    figures["bf16"] = {"beam5_sent_per_s": bf16_speed, "equal_to_fp32": same}
    report.row(
        name,
        f"{bf16_speed:,.1f} sent/s ({bf16_speed / speed:.2f}x fp32), "
        f"{same}/{len(lines)} equal to fp32",
    )
    return figures
