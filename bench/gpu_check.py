"""Check and measure convseq on one NVIDIA GPU; prints one table (and `--json PATH`).

What it does, in order (docs/gpu.md explains each row):

1. Compares training on the device with training on the CPU (`bench/gpu_parity.py`): fp32,
   bf16-mixed and 16-mixed runs of `--parity-updates` updates with dropout 0 against a CPU fp32
   run of the same seed and batches: the first update's gradient norm, the loss of the last
   update and the parameters' change, each within a tolerance per precision. Then trains the
   `fconv_iwslt_de_en` preset with the Multi30k recipe (`experiment=multi30k_fconv`, or
   `data=toy` when `<data root>/multi30k/` is absent) for `--updates` updates in fp32 and in
   `16-mixed`, through `convseq.tasks.train.train`: target words per second, peak GPU memory.
2. Trains the big `fconv_wmt_en_de` preset on synthetic batches (random token ids, a fixed
   shape) in fp32 and 16-mixed (autocast + GradScaler): target tokens per second, peak memory.
3. Translates the first 200 test sentences with beam 5 on the GPU and on the CPU, from the fp32
   run's best checkpoint: the hypotheses must be identical (`--allow-mismatch` only reports).
   Then sentences per second at beam 1 and beam 5, 128 sentences a batch.
4. Reads `test_device` from the fp32 run's summary.json: the end-of-training test translation
   must have run on the GPU.

    python bench/gpu_check.py                             # sized for under 8 minutes on one GPU
    python bench/gpu_check.py --updates 500 --json gpu.json --out runs/gpu
    python bench/gpu_check.py --dry-run                   # the same code path on the CPU, tiny

Exit status: 0 when every check passes, 1 when one fails, 2 without a CUDA device (and no
`--dry-run`).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from convseq.common.tf32 import set_tf32
from gpu_parity import (
    FAULTS,
    beam_agreement,
    compare,
    describe,
    parity_overrides,
    parity_run,
)
from machine import machine, machine_line  # bench/, beside this script (on sys.path as a script)

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "conf"
DEFAULT_DATA_ROOT = ROOT.parent / "shared" / "data"

PRESET = "fconv_iwslt_de_en"
BIG_PRESET = "fconv_wmt_en_de"
FP32, BF16, MIXED = "32-true", "bf16-mixed", "16-mixed"
PRECISIONS_ALL = (FP32, MIXED)  # the measured training runs
PARITY_ALL = (FP32, BF16, MIXED)  # the runs compared with the CPU
LABEL = {FP32: "fp32", BF16: "bf16-mixed", MIXED: "16-mixed"}
BEAM_BATCH = 128  # sentences per batch in the translation checks
SKIP_UPDATES = 10  # updates left out of the wps figure: allocator and kernel warm-up
MIXED_ON_CPU = "fp16 autocast on the CPU is not the GPU path"
# The tests' tiny model (tests/training_utils.py), for the dry run.
TINY_MODEL = [
    "model.encoder_embed_dim=16",
    "model.decoder_embed_dim=16",
    "model.decoder_out_embed_dim=16",
    "model.encoder_layers=[[16,3]]",
    "model.decoder_layers=[[16,3]]",
]
# The recipe picks best.ckpt by valid BLEU; BLEU during training is off here (it costs time and
# measures nothing this check needs), so best.ckpt goes by valid loss.
RECIPE_WITHOUT_BLEU = [
    "bleu_every_n_epochs=0",
    "checkpoint.monitor=valid/loss",
    "checkpoint.mode=min",
    "checkpoint.keep_epochs=0",
    "optimized_metric=valid/loss",
]


@dataclass(frozen=True)
class Plan:
    """The sizes of one invocation: a real GPU run, or the dry run's tiny CPU version."""

    dry_run: bool
    device: str  # "cuda" or "cpu": where the measured runs go
    updates: int
    precisions: tuple[str, ...]
    parity: tuple[str, ...]  # precisions compared with the CPU
    parity_updates: int
    inject: str | None  # a fault planted in the device's parity runs (the tests' mutation check)
    beam_sentences: int
    big_batch: tuple[int, int]  # (sentences, tokens each): source and target alike
    big_vocab: int
    big_warmup: int
    big_steps: int
    big_shrink: int  # channel divisor of the big preset (1 = the preset as it is)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Plan:
        if args.dry_run:
            # Small enough for 2 busy CPU cores in well under a minute.
            return cls(
                dry_run=True,
                device="cpu",
                updates=min(args.updates, 4),
                precisions=(FP32,),
                parity=(FP32, BF16),  # bf16 autocast is real on the CPU; fp16 is not the GPU's
                parity_updates=min(args.parity_updates, 8),
                inject=args.inject,
                beam_sentences=8,
                big_batch=(4, 8),
                big_vocab=1000,
                big_warmup=1,
                big_steps=2,
                big_shrink=32,
            )
        return cls(
            dry_run=False,
            device="cuda",
            updates=args.updates,
            precisions=(FP32, MIXED),
            parity=PARITY_ALL,
            parity_updates=args.parity_updates,
            inject=args.inject,
            beam_sentences=args.sentences,
            big_batch=args.big_batch,
            big_vocab=args.big_vocab,
            big_warmup=args.big_warmup,
            big_steps=args.big_steps,
            big_shrink=1,
        )


def batch_shape(text: str) -> tuple[int, int]:
    """--big-batch: "128x32" -> (128, 32)."""
    try:
        bsz, length = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected SENTENCESxTOKENS, e.g. 128x32: {text!r}"
        ) from None
    if bsz < 1 or length < 2:
        raise argparse.ArgumentTypeError(f"need at least 1 sentence of 2 tokens: {text!r}")
    return bsz, length


@dataclass
class Report:
    """Everything measured, the table's rows and the pass/fail checks."""

    env: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (name, value, status)
    checks: list[dict[str, Any]] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine)  # CPU, torch, GPU: bench/machine.py

    def row(self, name: str, value: str, ok: bool | None = None) -> None:
        """A table row; `ok` None is a measurement, True/False a check."""
        status = "-" if ok is None else ("PASS" if ok else "FAIL")
        self.rows.append((name, value, status))
        if ok is not None:
            self.checks.append({"name": name, "ok": ok, "detail": value})

    def skip(self, name: str, why: str) -> None:
        self.rows.append((name, why, "skip"))

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            **self.figures,
            "env": self.env,
            "checks": self.checks,
            "ok": self.ok,
        }


# -- environment ------------------------------------------------------------------------------
def environment(plan: Plan) -> dict[str, Any]:
    """Device name and versions, printed above the table."""
    cuda = plan.device == "cuda"
    cudnn = torch.backends.cudnn.version() if cuda else None
    return {
        "dry_run": plan.dry_run,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "updates": plan.updates,
    }


def reset_peak(device: str) -> None:
    """Forget the previous step's tensors and peak, so each peak is that step's own."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_mib(device: str) -> float | None:
    """Peak allocated GPU memory since `reset_peak`; None on the CPU (no allocator figure)."""
    return torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """Lightning's per-run info lines ("GPU available", tips) would bury the progress lines."""
    logger = logging.getLogger("pytorch_lightning")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


# -- configuration ----------------------------------------------------------------------------
def compose(overrides: Sequence[str], output_dir: Path) -> dict[str, Any]:
    """The resolved config of conf/config.yaml with `overrides`, as run.py composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from convseq.tasks.dispatch import to_plain
    from convseq.tasks.schema import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()
    # Outside a Hydra run there is no runtime folder to interpolate: set it by hand.
    cfg.paths.output_dir = str(output_dir)
    return to_plain(cfg)


def data_root(args: argparse.Namespace) -> Path:
    given = args.data_root or os.environ.get("CONVSEQ_DATA_ROOT")
    return Path(given).expanduser().absolute() if given else DEFAULT_DATA_ROOT


def corpus_overrides(args: argparse.Namespace, plan: Plan, out: Path) -> tuple[list[str], str]:
    """The corpus and model overrides of the training runs, and a line naming the corpus."""
    if plan.dry_run:
        from convseq.data.toy.corpus import write_toy_corpus

        corpus = out / "toy-corpus"
        # A few hundred pairs: a handful of updates, and a test split translated in a second.
        write_toy_corpus(corpus, seed=1, n_train=600, n_valid=40, n_test=40)
        overrides = ["data=toy", "data.generator=null", f"data.dir={corpus}", f"model={PRESET}"]
        return [*overrides, *TINY_MODEL], f"toy, 600 train pairs, tiny {PRESET} (dry run)"
    root = data_root(args)
    if (root / "multi30k" / "train.de").is_file():
        overrides = ["experiment=multi30k_fconv", f"paths.data_root={root}"]
        return [*overrides, *RECIPE_WITHOUT_BLEU], f"multi30k de-en ({root}), {PRESET} recipe"
    return ["data=toy", f"model={PRESET}"], f"toy (no multi30k/ under {root}), {PRESET}"


def run_overrides(device: str, precision: str, updates: int, final_test: bool) -> list[str]:
    """Device, precision and length of one training run; every update logged to metrics.csv."""
    return [
        f"trainer.accelerator={'gpu' if device == 'cuda' else 'cpu'}",
        "trainer.devices=1",
        f"trainer.precision={precision}",
        *([f"max_update={updates}"] if updates else []),  # 0: the caller sets the length
        # 0 = no epoch limit: max_update stops the run (an epoch of Multi30k is ~134 updates).
        "trainer.max_epochs=0",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false",
        "bleu_every_n_epochs=0",
        f"final_test={str(final_test).lower()}",
    ]


# -- 1. training runs -------------------------------------------------------------------------
def train_run(cfg: dict[str, Any], device: str) -> dict[str, Any]:
    """Run `train(cfg)`; its summary.json, per-update rows of metrics.csv and peak memory."""
    from convseq.evaluation.history import METRICS_FILE, SUMMARY_FILE, read_metrics
    from convseq.tasks.train import train

    reset_peak(device)
    t0 = time.perf_counter()
    with quiet_lightning():
        train(cfg)
    seconds = time.perf_counter() - t0
    out = Path(cfg["paths"]["output_dir"])
    rows = read_metrics(out / "csv" / METRICS_FILE)
    updates = sorted((r for r in rows if "train/loss" in r), key=lambda r: r["step"])
    if not updates:
        raise RuntimeError(f"{out}: metrics.csv holds no train/loss row")
    summary = json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8"))
    return {"summary": summary, "updates": updates, "peak": peak_mib(device), "seconds": seconds}


def steady_wps(updates: list[dict[str, float]]) -> float:
    """Target tokens / seconds over the updates after the first few (warm-up left out)."""
    skip = min(SKIP_UPDATES, len(updates) // 3)
    kept = [u for u in updates[skip:] if u.get("train/wps", 0.0) > 0]
    tokens = sum(u["train/wpb"] for u in kept)
    seconds = sum(u["train/wpb"] / u["train/wps"] for u in kept)
    return tokens / seconds if seconds > 0 else math.nan


@contextmanager
def threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `n` for a while (None: left alone)."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
    for precision in PARITY_ALL:
        name = f"parity {LABEL[precision]} vs CPU"
        if precision not in plan.parity:
            figures[LABEL[precision]] = {"skipped": MIXED_ON_CPU}
            report.skip(name, MIXED_ON_CPU)
            continue
        print(f"gpu_check: parity, {plan.device} {LABEL[precision]}", flush=True)
        overrides = [*common, *run_overrides(plan.device, precision, 0, False)]
        with quiet_lightning():
            run = parity_run(compose, overrides, out / f"par-{LABEL[precision]}", plan.inject)
        result = compare(run, ref, precision)
        figures[LABEL[precision]] = {**result, "gnorm_1": run["gnorm_1"], "loss_n": run["loss_n"]}
        report.row(name, describe(result), all(result["ok"].values()))
    report.figures["parity"] = figures


def training_measurements(report: Report, plan: Plan, base: list[str], out: Path) -> dict:
    """The measured training runs; returns the fp32 run (its checkpoint and summary)."""
    set_tf32(True)  # as run.py trains by default (trainer.tf32=true): the speed a user gets
    figures: dict[str, Any] = {}
    runs: dict[str, dict[str, Any]] = {}
    for precision in PRECISIONS_ALL:
        name = f"train {LABEL[precision]}"
        if precision not in plan.precisions:
            figures[LABEL[precision]] = {"skipped": MIXED_ON_CPU}
            report.skip(name, MIXED_ON_CPU)
            continue
        print(f"gpu_check: training, {plan.device} {LABEL[precision]}", flush=True)
        # The end-of-training test translation (step 4) is checked on the fp32 run only.
        overrides = [*base, *run_overrides(plan.device, precision, plan.updates, precision == FP32)]
        run = train_run(compose(overrides, out / f"train-{LABEL[precision]}"), plan.device)
        runs[precision] = run
        figures[LABEL[precision]] = training_figures(run)
        report.row(name, describe_training(figures[LABEL[precision]]))
    report.figures["train"] = figures
    return runs[FP32]


def training_figures(run: dict[str, Any]) -> dict[str, Any]:
    summary = run["summary"]
    return {
        "wps": steady_wps(run["updates"]),
        "wps_epochs": [h.get("train_epoch/wps") for h in summary.get("history", [])],
        "peak_mem_mib": run["peak"],
        "updates": int(summary["updates"]),
        "first_loss": float(run["updates"][0]["train/loss"]),
        "last_loss": float(run["updates"][-1]["train/loss"]),
        "train_seconds": float(summary["train_seconds"]),
        "run_seconds": run["seconds"],
    }


def describe_training(f: dict[str, Any]) -> str:
    return (
        f"{f['wps']:,.0f} tgt tok/s, peak {mib(f['peak_mem_mib'])}, {f['updates']} updates, "
        f"loss {f['first_loss']:.2f} -> {f['last_loss']:.2f}"
    )


def mib(value: float | None) -> str:
    return "n/a (CPU)" if value is None else f"{value / 1024:.2f} GiB"


# -- 2. the big preset on synthetic batches ---------------------------------------------------
def shrink_layers(layers: Any, factor: int) -> Any:
    """A layer list with every channel count divided by `factor` (kernel, residual kept)."""
    out = []
    for entry in layers:
        if isinstance(entry, dict):  # {layer: [channels, kernel(, residual)], repeat: n}
            out.append({**entry, "layer": shrink_layers([entry["layer"]], factor)[0]})
        else:
            out.append([max(int(entry[0]) // factor, 8), *entry[1:]])
    return out


def big_model_config(out: Path, shrink: int) -> dict[str, Any]:
    """The big preset's model, optim and criterion groups (fairseq's WMT recipe smoothing)."""
    cfg = compose([f"model={BIG_PRESET}", "criterion.label_smoothing=0.1"], out)
    model = dict(cfg["model"])
    if shrink > 1:  # the dry run: the preset's 30 layers and projections, narrower
        for key in ("encoder_embed_dim", "decoder_embed_dim", "decoder_out_embed_dim"):
            model[key] = max(int(model[key]) // shrink, 8)
        for key in ("encoder_layers", "decoder_layers"):
            model[key] = shrink_layers(model[key], shrink)
    return {"model": model, "optim": cfg["optim"], "criterion": cfg["criterion"]}


def synthetic_batch(vocab: int, bsz: int, length: int, device: str) -> dict[str, Any]:
    """Random ids in fairseq's layout; ids from 4 on (0-3 are <s>, <pad>, </s>, <unk>)."""
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab, (bsz, length), generator=gen)
    target = torch.randint(4, vocab, (bsz, length), generator=gen)
    target[:, -1] = 2  # every target ends in EOS
    prev = torch.cat([torch.full((bsz, 1), 2), target[:, :-1]], dim=1)  # EOS first
    lengths = torch.full((bsz,), length)
    net = {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}
    return {
        "net_input": {k: v.to(device) for k, v in net.items()},
        "target": target.to(device),
        "ntokens": bsz * length,
    }


def big_step_fn(parts: dict[str, Any], batch: dict, device: str, mixed: bool) -> Callable:
    """One update as ConvSeqModule makes it: summed loss / tokens, clip, optimiser step."""
    model, criterion, optimizer = parts["model"], parts["criterion"], parts["optimizer"]
    params = [p for p in model.parameters() if p.requires_grad]
    scaler = torch.amp.GradScaler(device, enabled=mixed)
    clip = float(parts["clip"])

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.float16, enabled=mixed):
            logits, _ = model(**batch["net_input"])
            out = criterion(logits, batch["target"])  # the loss itself is float32
        scaler.scale(out.loss / batch["ntokens"]).backward()
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        scaler.step(optimizer)
        scaler.update()
        return out.loss.detach() / batch["ntokens"]

    return step


def big_parts(cfg: dict[str, Any], vocab: int, device: str) -> dict[str, Any]:
    from convseq import FConvModel
    from convseq.optim.build import build_optimizer
    from convseq.training.criterion import LabelSmoothedCrossEntropy

    torch.manual_seed(1)
    model = FConvModel.build(cfg["model"], vocab, vocab).to(device).train()
    return {
        "model": model,
        "criterion": LabelSmoothedCrossEntropy.from_config(cfg["criterion"], padding_idx=1),
        "optimizer": build_optimizer(model.parameters(), cfg["optim"]),
        "clip": cfg["optim"].get("clip_norm") or 0.0,
        "params": sum(p.numel() for p in model.parameters()),
    }


def big_run(plan: Plan, cfg: dict[str, Any], precision: str) -> dict[str, Any]:
    """Warm-up steps, then `big_steps` timed steps between two device synchronisations."""
    reset_peak(plan.device)
    parts = big_parts(cfg, plan.big_vocab, plan.device)
    batch = synthetic_batch(plan.big_vocab, *plan.big_batch, plan.device)
    step = big_step_fn(parts, batch, plan.device, mixed=precision == MIXED)
    for _ in range(plan.big_warmup):
        step()
    synchronize(plan.device)
    t0 = time.perf_counter()
    losses = [step() for _ in range(plan.big_steps)]
    synchronize(plan.device)
    seconds = time.perf_counter() - t0
    result = {
        "tokens_per_s": batch["ntokens"] * plan.big_steps / seconds,
        "seconds_per_step": seconds / plan.big_steps,
        "peak_mem_mib": peak_mib(plan.device),
        "params_m": parts["params"] / 1e6,
        "last_loss": float(losses[-1]),
    }
    del parts, batch, step, losses
    return result


def big_measurements(report: Report, plan: Plan, out: Path) -> None:
    cfg = big_model_config(out, plan.big_shrink)
    bsz, length = plan.big_batch
    figures: dict[str, Any] = {
        "batch": f"{bsz}x{length}",
        "vocab": plan.big_vocab,
        "channel_divisor": plan.big_shrink,
    }
    for precision in PRECISIONS_ALL:
        name = f"big preset {LABEL[precision]}"
        if precision not in plan.precisions:
            figures[LABEL[precision]] = {"skipped": MIXED_ON_CPU}
            report.skip(name, MIXED_ON_CPU)
            continue
        print(f"gpu_check: {BIG_PRESET}, synthetic batches, {LABEL[precision]}", flush=True)
        f = big_run(plan, cfg, precision)
        figures[LABEL[precision]] = f
        report.row(
            name,
            f"{f['tokens_per_s']:,.0f} tgt tok/s, peak {mib(f['peak_mem_mib'])}, "
            f"{f['params_m']:.1f}M params, batch {bsz}x{length}",
        )
    report.figures["big"] = figures


# -- 3. beam search on the device vs the CPU --------------------------------------------------
def test_sources(cfg: dict[str, Any], n: int) -> list[str]:
    """The first `n` source lines of the corpus's test split (raw text)."""
    data = cfg["data"]
    path = Path(data["dir"]) / f"{data.get('test_split', 'test')}.{data['src_lang']}"
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for _, line in zip(range(n), f)]
    return lines


def translate(translator: Any, lines: list[str], beam: int) -> list[str]:
    return translator.translate(lines, beam=beam, batch_size=BEAM_BATCH, max_tokens=None)


def sentences_per_second(translator: Any, lines: list[str], beam: int, device: str) -> float:
    synchronize(device)
    t0 = time.perf_counter()
    translate(translator, lines, beam)
    synchronize(device)
    return len(lines) / (time.perf_counter() - t0)


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
    speed = {beam: sentences_per_second(on_device, lines, beam, plan.device) for beam in (1, 5)}
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


# -- 4. where the end-of-training translation ran ---------------------------------------------
def test_device_check(report: Report, plan: Plan, summary: dict[str, Any]) -> None:
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


# -- the table --------------------------------------------------------------------------------
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


# -- main -------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="the same path on the CPU, tiny sizes")
    p.add_argument("--updates", type=int, default=300, help="updates per training run")
    p.add_argument(
        "--parity-updates", type=int, default=20, help="updates of each run compared with the CPU"
    )
    p.add_argument(
        "--only", choices=["parity"], help="run the comparison with the CPU alone (no timings)"
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
    p.add_argument(
        "--big-batch", type=batch_shape, default=(128, 32), help="synthetic batch: SENTENCESxTOKENS"
    )
    p.add_argument("--big-vocab", type=int, default=40000, help="synthetic vocabulary size")
    p.add_argument("--big-warmup", type=int, default=5, help="untimed synthetic steps")
    p.add_argument("--big-steps", type=int, default=20, help="timed synthetic steps")
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
    p.add_argument("--json", help="also write the figures to this JSON file")
    return p.parse_args(argv)


def check_all(args: argparse.Namespace, plan: Plan, out: Path) -> tuple[Report, str]:
    report = Report(environment(plan))
    base, corpus = corpus_overrides(args, plan, out)
    report.figures["corpus"] = corpus
    parity_checks(report, plan, base, out)
    if args.only == "parity":
        return report, corpus
    fp32 = training_measurements(report, plan, base, out)
    big_measurements(report, plan, out)
    summary = fp32["summary"]
    ckpt = summary.get("best_checkpoint") or summary["last_checkpoint"]
    lines = test_sources(compose(base, out / "unused"), plan.beam_sentences)
    beam_measurements(report, plan, ckpt, lines, args.allow_mismatch)
    test_device_check(report, plan, summary)
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
    with output_folder(args.out) as out:
        report, corpus = check_all(args, plan, out)
        report.figures["seconds"] = time.perf_counter() - t0
        kept = str(out) if args.out else f"{out} (deleted at exit; --out keeps them)"
        print("\n" + table(report, corpus, kept), flush=True)
    print(f"gpu_check: {report.figures['seconds']:.0f} s in all", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_json(), indent=2) + "\n", encoding="utf-8")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
