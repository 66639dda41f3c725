"""The translation parts of bench/gpu_check.py: beam 5 on the device against the CPU (a check),
sentences per second at beam 1 and 5, and `gen.precision=bf16` against fp32 (a measurement)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gpu_common import Plan, Report, synchronize
from gpu_parity import beam_agreement

if TYPE_CHECKING:
    from convseq.training.config import TrainConfig

BEAM_BATCH = 128  # sentences per batch in the translation checks


def test_sources(cfg: TrainConfig, n: int) -> list[str]:
    """The first `n` source lines of the corpus's test split (raw text)."""
    from convseq.data.corpus_dir import with_corpus_dir

    # data.dir, or with it unset (the toy group) the generator's folder in the cache
    data = with_corpus_dir(cfg.data, cfg.paths.cache_dir)
    path = Path(data.dir) / f"{data.test_split}.{data.src_lang}"
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for _, line in zip(range(n), f)]
    return lines


def translate(translator: Any, lines: list[str], beam: int) -> list[str]:
    return translator.translate(lines, beam=beam, batch_size=BEAM_BATCH, max_tokens=None)


def timed_translate(translator: Any, lines: list[str], beam: int, device: str) -> tuple:
    """(hypotheses, sentences per second), between two device synchronisations."""
    synchronize(device)
    t0 = time.perf_counter()
    hyps = translate(translator, lines, beam)
    synchronize(device)
    return hyps, len(lines) / (time.perf_counter() - t0)


def beam_measurements(
    report: Report, plan: Plan, ckpt: str, lines: list[str], allow_mismatch: bool
) -> None:
    from convseq import Translator

    print(f"gpu_check: beam 5 on {len(lines)} test sentences, CPU and {plan.device}", flush=True)
    # the CPU's two best of each sentence: their gap tells a near-tie from a wrong search
    reference = Translator.from_checkpoints(ckpt).translate_records(
        lines, beam=5, nbest=2, batch_size=BEAM_BATCH, max_tokens=None
    )
    on_device = Translator.from_checkpoints(ckpt).to(plan.device)
    hypotheses = translate(on_device, lines, beam=5)  # also the device's warm-up
    agreement = beam_agreement(reference, hypotheses)
    speed = {beam: timed_translate(on_device, lines, beam, plan.device)[1] for beam in (1, 5)}
    report.figures["beam"] = {
        "sentences": len(lines),
        **agreement,
        "share": agreement["identical"] / len(lines),
        "beam1_sent_per_s": speed[1],
        "beam5_sent_per_s": speed[5],
        "batch_size": BEAM_BATCH,
    }
    ok = agreement["mismatched"] == 0 or allow_mismatch
    value = (
        f"{agreement['identical']}/{len(lines)} identical, {agreement['ties']} near-ties "
        f"(gap < {agreement['margin']:g}), {agreement['mismatched']} mismatched"
    )
    allowed = " (allowed)" if agreement["mismatched"] and allow_mismatch else ""
    report.row(f"beam 5 {plan.device} vs CPU", value + allowed, ok)
    for beam in (1, 5):
        report.row(f"translate beam {beam}, batch {BEAM_BATCH}", f"{speed[beam]:,.1f} sent/s")
    bf16_measurement(report, plan, ckpt, lines, hypotheses)


def bf16_unsupported(device: str) -> str | None:
    """Why `gen.precision=bf16` cannot run on `device` (None when it can)."""
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability(0)
        return None if major >= 8 else f"compute capability {major}.{minor} < 8.0: no bf16"
    from convseq.inference.precision import cpu_has

    return None if cpu_has("bf16") else "this CPU has no AVX-512 BF16"


def bf16_measurement(
    report: Report, plan: Plan, ckpt: str, lines: list[str], fp32_hyps: list[str]
) -> None:
    """Beam 5 with `gen.precision=bf16`: sentences per second beside fp32, and how many
    hypotheses equal the fp32 ones (a measurement: bf16 rounding may change a search)."""
    from convseq import Translator

    name = "translate beam 5, gen.precision=bf16"
    why = bf16_unsupported(plan.device)
    if why:
        report.figures["beam_bf16"] = {"skipped": why}
        report.skip(name, why)
        return
    print(f"gpu_check: beam 5 in bf16 on {plan.device}", flush=True)
    bf16 = Translator.from_checkpoints(ckpt).to(plan.device).with_precision("bf16", plan.device)
    translate(bf16, lines[:BEAM_BATCH], beam=5)  # warm-up
    hyps, speed = timed_translate(bf16, lines, 5, plan.device)
    same = sum(a == b for a, b in zip(hyps, fp32_hyps, strict=True))
    fp32_speed = report.figures["beam"]["beam5_sent_per_s"]
    report.figures["beam_bf16"] = {
        "beam5_sent_per_s": speed,
        "speedup": speed / fp32_speed,
        "equal_to_fp32": same,
        "sentences": len(lines),
    }
    report.row(
        name,
        f"{speed:,.1f} sent/s ({speed / fp32_speed:.2f}x fp32), {same}/{len(lines)} equal to fp32",
    )
