"""The training parts of bench/gpu_check.py: the comparison with the CPU (bench/gpu_parity.py),
the measured runs of the recipe preset and of the big preset, and where the end-of-training
test translation ran. Every run goes through `convseq.tasks.train.train`: token batches with
padding, the trainer's loss normalisation and its fp16 loss scaler."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from convseq.common.tf32 import set_tf32
from gpu_common import (
    BIG_PRESET,
    FP32,
    LABEL,
    PRECISIONS_ALL,
    Plan,
    Report,
    compose,
    mib,
    peak_mib,
    quiet_lightning,
    reset_peak,
    run_overrides,
    skipped_why,
    threads,
    without_model,
)
from gpu_parity import FAULTS, compare, describe, parity_overrides, parity_run

if TYPE_CHECKING:
    from convseq.training.config import TrainConfig

SKIP_UPDATES = 10  # updates left out of the wps figure: allocator and kernel warm-up


def _run_probe() -> Any:
    """A callback that reads, at the end of training, the fp16 loss scale (None without one:
    summary.json records the skipped updates, not the scale) and the parameter count."""
    import pytorch_lightning as pl

    class RunProbe(pl.Callback):
        def __init__(self) -> None:
            self.scale: float | None = None
            self.params = 0

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            scaler = getattr(trainer.precision_plugin, "scaler", None)
            self.scale = float(scaler.get_scale()) if scaler is not None else None
            self.params = sum(p.numel() for p in pl_module.parameters())

    return RunProbe()


def train_run(cfg: TrainConfig, device: str) -> dict[str, Any]:
    """Run `train(cfg)`; its summary.json, per-update rows of metrics.csv, peak memory and the
    final fp16 loss scale."""
    from convseq.evaluation.history import METRICS_FILE, SUMMARY_FILE, read_metrics
    from convseq.tasks.train import train

    reset_peak(device)
    probe = _run_probe()
    t0 = time.perf_counter()
    with quiet_lightning():
        train(cfg, callbacks=[probe])
    seconds = time.perf_counter() - t0
    out = Path(cfg.paths.output_dir)
    rows = read_metrics(out / "csv" / METRICS_FILE)
    updates = sorted((r for r in rows if "train/loss" in r), key=lambda r: r["step"])
    if not updates:
        raise RuntimeError(f"{out}: metrics.csv holds no train/loss row")
    summary = json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8"))
    return {
        "summary": summary,
        "updates": updates,
        "peak": peak_mib(device),
        "seconds": seconds,
        "loss_scale": probe.scale,
        "params": probe.params,
    }


def steady_wps(updates: list[dict[str, float]]) -> float:
    """Target tokens / seconds over the updates after the first few (warm-up left out)."""
    skip = min(SKIP_UPDATES, len(updates) // 3)
    kept = [u for u in updates[skip:] if u.get("train/wps", 0.0) > 0]
    tokens = sum(u["train/wpb"] for u in kept)
    seconds = sum(u["train/wpb"] / u["train/wps"] for u in kept)
    return tokens / seconds if seconds > 0 else math.nan


def training_figures(run: dict[str, Any]) -> dict[str, Any]:
    summary = run["summary"]
    return {
        "wps": steady_wps(run["updates"]),
        "wps_epochs": [h.get("train_epoch/wps") for h in summary.get("history", [])],
        "peak_mem_mib": run["peak"],
        "updates": int(summary["updates"]),
        "skipped_updates": int(summary.get("skipped_updates", 0)),
        "loss_scale": run["loss_scale"],  # 16-mixed only; None otherwise
        "first_loss": float(run["updates"][0]["train/loss"]),
        "last_loss": float(run["updates"][-1]["train/loss"]),
        "train_seconds": float(summary["train_seconds"]),
        "run_seconds": run["seconds"],
    }


def describe_training(f: dict[str, Any]) -> str:
    text = (
        f"{f['wps']:,.0f} tgt tok/s, peak {mib(f['peak_mem_mib'])}, {f['updates']} updates, "
        f"loss {f['first_loss']:.2f} -> {f['last_loss']:.2f}"
    )
    if f["loss_scale"] is not None:
        text += f", {f['skipped_updates']} skipped, scale {f['loss_scale']:g}"
    return text


# -- 1. parity with the CPU -------------------------------------------------------------------
def parity_checks(report: Report, plan: Plan, base: list[str], out: Path) -> None:
    """Training on the device in each precision against the CPU in fp32 (gpu_parity.py)."""
    common = [*base, *parity_overrides(plan.parity_updates)]
    # fp32 compared as fp32: TF32 products would differ from the CPU by ~1e-3 each (run.py
    # sets this from trainer.tf32; train() called here does not)
    set_tf32(False)
    print(f"gpu_check: parity, CPU fp32 reference ({plan.parity_updates} updates)", flush=True)
    # The dry run compares the CPU with itself: one thread against two gives the reference
    # other reduction orders, as a device would.
    with threads(1 if plan.dry_run else None), quiet_lightning():
        ref = parity_run(compose, [*common, *run_overrides("cpu", FP32, 0, False)], out / "par-cpu")
    figures: dict[str, Any] = {"reference": {k: ref[k] for k in ("gnorm_1", "loss_n")}}
    if plan.inject:
        figures["injected"] = {"fault": plan.inject, "what": FAULTS[plan.inject][0]}
    for precision in PRECISIONS_ALL:
        name = f"parity {LABEL[precision]} vs CPU"
        if precision not in plan.parity:
            figures[LABEL[precision]] = {"skipped": skipped_why(precision)}
            report.skip(name, skipped_why(precision))
            continue
        print(f"gpu_check: parity, {plan.device} {LABEL[precision]}", flush=True)
        overrides = [*common, *run_overrides(plan.device, precision, 0, False)]
        with quiet_lightning():
            run = parity_run(compose, overrides, out / f"par-{LABEL[precision]}", plan.inject)
        result = compare(run, ref, precision)
        figures[LABEL[precision]] = {**result, "gnorm_1": run["gnorm_1"], "loss_n": run["loss_n"]}
        report.row(name, describe(result), all(result["ok"].values()))
    report.figures["parity"] = figures


# -- 2. the recipe preset ---------------------------------------------------------------------
def training_measurements(report: Report, plan: Plan, base: list[str], out: Path) -> dict:
    """The measured training runs; returns the fp32 run (its checkpoint and summary)."""
    set_tf32(True)  # as run.py trains by default (trainer.tf32=true): the speed a user gets
    figures: dict[str, Any] = {}
    runs: dict[str, dict[str, Any]] = {}
    for precision in PRECISIONS_ALL:
        name = f"train {LABEL[precision]}"
        if precision not in plan.precisions:
            figures[LABEL[precision]] = {"skipped": skipped_why(precision)}
            report.skip(name, skipped_why(precision))
            continue
        print(f"gpu_check: training, {plan.device} {LABEL[precision]}", flush=True)
        # The end-of-training test translation is checked on the fp32 run only.
        overrides = [*base, *run_overrides(plan.device, precision, plan.updates, precision == FP32)]
        run = train_run(compose(overrides, out / f"train-{LABEL[precision]}"), plan.device)
        runs[precision] = run
        figures[LABEL[precision]] = training_figures(run)
        report.row(name, describe_training(figures[LABEL[precision]]))
    report.figures["train"] = figures
    return runs[FP32]


def test_device_check(report: Report, plan: Plan, summary: dict[str, Any]) -> None:
    """`test_device` of the fp32 run's summary.json: the test translation ran on the device."""
    device = summary.get("test_device")
    report.figures["test_device"] = device if device is not None else "missing"
    name = "end-of-training test device"
    if device is None:
        # Only a real GPU run must prove where it translated; the dry run just reports it.
        report.row(
            name, "missing (no test_device in summary.json)", None if plan.dry_run else False
        )
        return
    report.row(name, str(device), str(device).split(":")[0] == plan.device)


# -- 3. the big preset ------------------------------------------------------------------------
def shrink_layers(layers: Any, factor: int) -> Any:
    """A layer list with every channel count divided by `factor` (kernel, residual kept)."""
    out = []
    for entry in layers:
        if isinstance(entry, dict):  # {layer: [channels, kernel(, residual)], repeat: n}
            out.append({**entry, "layer": shrink_layers([entry["layer"]], factor)[0]})
        else:
            out.append([max(int(entry[0]) // factor, 8), *entry[1:]])
    return out


def _override_value(value: Any) -> str:
    """A layer list as a Hydra override value: [{layer:[16,3],repeat:9},[32,1]]."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_override_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    return str(value)


def big_overrides(shrink: int, out: Path) -> list[str]:
    """`model=fconv_wmt_en_de`, with every channel count divided by `shrink` (the dry run:
    the preset's 30 layers and projections, narrower) as model.* overrides."""
    overrides = [f"model={BIG_PRESET}"]
    if shrink <= 1:
        return overrides
    model = compose(overrides, out).model
    for key in ("encoder_embed_dim", "decoder_embed_dim", "decoder_out_embed_dim"):
        overrides.append(f"model.{key}={max(int(getattr(model, key)) // shrink, 8)}")
    for key in ("encoder_layers", "decoder_layers"):
        layers = shrink_layers(getattr(model, key), shrink)
        overrides.append(f"model.{key}={_override_value(layers)}")
    return overrides


def big_measurements(report: Report, plan: Plan, base: list[str], out: Path) -> None:
    """The big preset trained for `big_updates` updates on the same corpus, in each precision."""
    set_tf32(True)
    model = big_overrides(plan.big_shrink, out / "unused")
    figures: dict[str, Any] = {"updates": plan.big_updates, "channel_divisor": plan.big_shrink}
    for precision in PRECISIONS_ALL:
        name = f"big preset {LABEL[precision]}"
        if precision not in plan.precisions:
            figures[LABEL[precision]] = {"skipped": skipped_why(precision)}
            report.skip(name, skipped_why(precision))
            continue
        print(f"gpu_check: {BIG_PRESET}, {LABEL[precision]}", flush=True)
        overrides = [
            *without_model(base),
            *model,
            *run_overrides(plan.device, precision, plan.big_updates, False),
            "trainer.limit_val_batches=2",  # validation is not what is measured here
        ]
        cfg = compose(overrides, out / f"big-{LABEL[precision]}")
        run = train_run(cfg, plan.device)
        f = training_figures(run)
        f["params_m"] = run["params"] / 1e6
        figures[LABEL[precision]] = f
        report.row(name, f"{describe_training(f)}, {f['params_m']:.1f}M params")
    report.figures["big"] = figures


def steady_ups(updates: list[dict[str, float]]) -> float:
    """Updates per second over the updates after the first few (warm-up left out)."""
    skip = min(SKIP_UPDATES, len(updates) // 3)
    seconds = [u["train/wpb"] / u["train/wps"] for u in updates[skip:] if u.get("train/wps", 0)]
    return len(seconds) / sum(seconds) if seconds and sum(seconds) > 0 else math.nan
