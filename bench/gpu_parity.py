"""Does training on the device compute what training on the CPU computes? (bench/gpu_check.py)

The first update's loss cannot tell: at initialisation it is about log2(V) for any model, so
a decoder whose output is thrown away, or one without attention, passes a loss comparison.
What the check compares instead, between the CPU in fp32 (the reference) and the device in each
precision, all with dropout 0 (the CPU and CUDA generators draw different masks), the same seed
and the same batches, through the trainer's own path (`convseq.tasks.train.train`):

- the gradient norm of the first update (before clipping): backward and normalisation;
- the loss of update N (`--parity-updates`, 20): forward, backward, clipping and the optimiser
  over N updates;
- the parameters' change over the N updates, as ||delta_device - delta_cpu|| / ||delta_cpu||:
  the optimiser step itself (the parameters alone differ too little from their initial values to
  tell a skipped step from rounding).

`FAULTS` are the bugs the check must catch. `--inject NAME` plants one in the device run (the
CPU tests run every one through the dry run and require the check to fail).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from convseq.training.config import TrainConfig

# Tolerances per precision: (first-update gradient norm, loss at update N, parameter change),
# relative. Measured on the CPU (Intel Xeon with AMX, torch 2.13) on the Multi30k recipe
# (fconv_iwslt_de_en, 4000-token batches, dropout 0, 20 updates), docs/gpu.md:
# - fp32 with 1 thread against 2 threads: 0, 0, 0 (the same sums); bf16-mixed against fp32:
#   6.8e-4, 4.5e-4, 2.7e-3 (the tests' tiny model, 8 updates: 9.7e-4, 1.1e-5, 1.8e-3);
# - the attention removed: 0.17, 0.15, 0.99 (tiny model: 4.2e-2, 7.7e-4, 0.38).
# fp32 leaves a device's other summation orders 1e-3 / 1e-3 / 1e-2: about a thousand times
# fp32's rounding, a tenth of the bf16 difference. bf16-mixed and 16-mixed (fp16 has more
# mantissa bits than bf16) leave about ten times the measured bf16 difference.
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "32-true": (1e-3, 1e-3, 1e-2),
    "bf16-mixed": (1e-2, 1e-2, 0.1),
    "16-mixed": (1e-2, 1e-2, 0.1),
}
FIGURES = ("gnorm_1", "loss_n", "delta")


def _uniform_logits(module: Any, trainer: Any) -> None:
    """The decoder's output thrown away: every position gets the same (zero) logits."""
    module.model.decoder.register_forward_hook(lambda m, i, out: (out[0] * 0.0, out[1]))


def _no_attention(module: Any, trainer: Any) -> None:
    """Every attention layer returns its input: no source information reaches the decoder."""
    from convseq.modules.attention import AttentionLayer

    for layer in module.modules():
        if isinstance(layer, AttentionLayer):
            layer.register_forward_hook(lambda m, inputs, out: (inputs[0], out[1]))


def _skip_step(module: Any, trainer: Any) -> None:
    """The optimiser step skipped: forward and backward run, the weights stay."""
    optimizer = trainer.optimizers[0]

    def step(closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        return closure() if closure is not None else None

    optimizer.step = step


# name -> (what it breaks, how: a function of (module, trainer) run at the start of training, or
# config overrides for the device run)
FAULTS: dict[str, tuple[str, Callable[[Any, Any], None] | list[str]]] = {
    "uniform_logits": ("decoder output replaced by uniform logits", _uniform_logits),
    "no_attention": ("attention removed", _no_attention),
    "sentence_norm": (
        "gradients normalised by sentences, not tokens",
        ["criterion.normalize=sentences"],
    ),
    "skip_step": ("optimiser step skipped", _skip_step),
}


def _probe_class() -> type:
    import pytorch_lightning as pl

    class Probe(pl.Callback):
        """Copies the parameters at the start and the end of training; plants a fault."""

        def __init__(self, fault: Callable[[Any, Any], None] | None) -> None:
            self.fault = fault
            self.start: dict[str, torch.Tensor] = {}
            self.end: dict[str, torch.Tensor] = {}

        @staticmethod
        def _copy(module: Any) -> dict[str, torch.Tensor]:
            return {n: p.detach().double().cpu().clone() for n, p in module.named_parameters()}

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.start = self._copy(pl_module)
            if self.fault is not None:
                self.fault(pl_module, trainer)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.end = self._copy(pl_module)

    return Probe


def parity_overrides(updates: int) -> list[str]:
    """Settings of every parity run: N updates, dropout 0, every update logged, no test."""
    return [
        "model.dropout=0",
        f"max_update={updates}",
        "trainer.max_epochs=0",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false",
        "trainer.limit_val_batches=2",  # a typed float: 2 means two batches, not 200%
        "bleu_every_n_epochs=0",
        "final_test=false",
    ]


def parity_run(
    compose: Callable[[Sequence[str], Path], TrainConfig],
    overrides: Sequence[str],
    out: Path,
    fault: str | None = None,
) -> dict[str, Any]:
    """One training run: its first gradient norm, last loss and parameter change."""
    from convseq.evaluation.history import METRICS_FILE, read_metrics
    from convseq.tasks.train import train

    action = FAULTS[fault][1] if fault else None
    extra = action if isinstance(action, list) else []
    probe = _probe_class()(action if callable(action) else None)
    cfg = compose([*overrides, *extra], out)
    train(cfg, callbacks=[probe])
    rows = read_metrics(out / "csv" / METRICS_FILE)
    updates = sorted((r for r in rows if "train/loss" in r), key=lambda r: r["step"])
    delta = {n: probe.end[n] - probe.start[n] for n in probe.start}
    return {
        "gnorm_1": float(updates[0]["train/gnorm"]),
        "loss_n": float(updates[-1]["train/loss"]),
        "updates": len(updates),
        "delta": delta,
    }


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b != 0 else (0.0 if a == b else math.inf)


def compare(run: dict[str, Any], ref: dict[str, Any], precision: str) -> dict[str, Any]:
    """The three relative differences against the CPU reference, and whether each is within
    its tolerance (NaN and inf never are)."""
    diff = sum(float((run["delta"][n] - d).pow(2).sum()) for n, d in ref["delta"].items())
    norm = sum(float(d.pow(2).sum()) for d in ref["delta"].values())
    rel = {
        "gnorm_1": _rel(run["gnorm_1"], ref["gnorm_1"]),
        "loss_n": _rel(run["loss_n"], ref["loss_n"]),
        "delta": math.sqrt(diff / norm) if norm > 0 else math.inf,
    }
    tol = dict(zip(FIGURES, TOLERANCES[precision]))
    ok = {k: math.isfinite(v) and v <= tol[k] for k, v in rel.items()}
    return {"rel": rel, "tol": tol, "ok": ok, "updates": run["updates"]}


def describe(result: dict[str, Any]) -> str:
    """One table cell: each figure's relative difference and its tolerance."""
    names = {"gnorm_1": "gnorm@1", "loss_n": f"loss@{result['updates']}", "delta": "dW"}
    return ", ".join(
        f"{names[k]} {result['rel'][k]:.1e}{'' if result['ok'][k] else '!'}"
        f" (tol {result['tol'][k]:.0e})"
        for k in FIGURES
    )


# Two hypotheses whose length-normalised log-probabilities (natural log, per token) are closer
# than this are a near-tie: another device's rounding may order them the other way.
TIE_MARGIN = 1e-3


def beam_agreement(
    cpu_records: Sequence[dict[str, Any]], device_texts: Sequence[str], margin: float = TIE_MARGIN
) -> dict[str, Any]:
    """Compare the device's best hypotheses with the CPU's, forgiving near-ties only.

    Args:
        cpu_records: the CPU's translation records (`Translator.translate_records` with
            nbest >= 2), in input order.
        device_texts: the device's best hypothesis of each sentence.
        margin: the largest score gap between the CPU's two best that counts as a near-tie.

    Returns:
        identical (sentences equal), ties (different, but the device's is the CPU's second
        and the gap is below the margin), mismatches (the rest, the first three listed).
    """
    identical, ties, mismatches = 0, 0, []
    for i, (record, text) in enumerate(zip(cpu_records, device_texts, strict=True)):
        hyps = record["hypotheses"]
        if hyps[0]["text"] == text:
            identical += 1
            continue
        gap = float(hyps[0]["score"] - hyps[1]["score"]) if len(hyps) > 1 else math.inf
        if len(hyps) > 1 and hyps[1]["text"] == text and gap < margin:
            ties += 1
            continue
        mismatches.append({"line": i, "cpu": hyps[0]["text"], "device": text, "gap": gap})
    return {
        "identical": identical,
        "ties": ties,
        "mismatched": len(mismatches),
        "mismatches": mismatches[:3],
        "margin": margin,
    }
