"""What the parts of bench/gpu_check.py share: the plan (sizes), the report (rows, checks,
figures), composing configs as run.py does, and device helpers."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from machine import machine  # bench/, beside this script (on sys.path as a script)

if TYPE_CHECKING:
    from convseq.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "conf"
DEFAULT_DATA_ROOT = ROOT.parent / "shared" / "data"

PRESET = "fconv_iwslt_de_en"
BIG_PRESET = "fconv_wmt_en_de"
LIGHTCONV_PRESET = "lightconv_iwslt_de_en"  # the other model family (bench/gpu_lightconv.py)
FP32, BF16, MIXED = "32-true", "bf16-mixed", "16-mixed"
PRECISIONS_ALL = (FP32, BF16, MIXED)  # the training runs, and the runs compared with the CPU
LABEL = {FP32: "fp32", BF16: "bf16-mixed", MIXED: "16-mixed"}
MIXED_ON_CPU = "fp16 autocast on the CPU is not the GPU path"
NO_BF16_ON_CPU = "this CPU has no AVX-512 BF16: bf16 would be emulated (convseq refuses it)"


def dry_run_precisions() -> tuple[str, ...]:
    """The precisions a dry run trains in on this CPU: fp32, and bf16-mixed where the CPU has
    bf16 arithmetic (bf16 autocast is real there; fp16's is not the GPU's)."""
    from convseq.inference.precision import cpu_has

    return (FP32, BF16) if cpu_has("bf16") else (FP32,)


def skipped_why(precision: str) -> str:
    """Why a dry run leaves `precision` out."""
    return MIXED_ON_CPU if precision == MIXED else NO_BF16_ON_CPU


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
    precisions: tuple[str, ...]  # the training runs, small and big preset
    parity: tuple[str, ...]  # precisions compared with the CPU
    parity_updates: int
    inject: str | None  # a fault planted in the device's parity runs (the tests' mutation check)
    beam_sentences: int
    big_updates: int
    big_shrink: int  # channel divisor of the big preset (1 = the preset as it is)
    lightconv_updates: int  # updates of each LightConv run (bench/gpu_lightconv.py)
    resume_updates: int  # the SIGTERM/resume run's length; SIGTERM after a third of it
    ddp_devices: int  # processes of the DDP run; 0: no DDP run (one GPU)
    ddp_updates: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Plan:
        if args.dry_run:
            # Small enough for 2 busy CPU cores in about a minute.
            return cls(
                dry_run=True,
                device="cpu",
                updates=min(args.updates, 4),
                precisions=dry_run_precisions(),
                parity=dry_run_precisions(),
                parity_updates=min(args.parity_updates, 8),
                inject=args.inject,
                beam_sentences=8,
                big_updates=min(args.big_updates, 3),
                big_shrink=32,
                lightconv_updates=min(args.lightconv_updates, 3),
                resume_updates=min(args.resume_updates, 12),
                ddp_devices=2,  # gloo processes on the CPU, through the same code
                ddp_updates=min(args.ddp_updates, 4),
            )
        gpus = torch.cuda.device_count()
        return cls(
            dry_run=False,
            device="cuda",
            updates=args.updates,
            precisions=PRECISIONS_ALL,
            parity=PRECISIONS_ALL,
            parity_updates=args.parity_updates,
            inject=args.inject,
            beam_sentences=args.sentences,
            big_updates=args.big_updates,
            big_shrink=1,
            lightconv_updates=args.lightconv_updates,
            resume_updates=args.resume_updates,
            ddp_devices=gpus if gpus > 1 else 0,
            ddp_updates=args.ddp_updates,
        )


@dataclass
class Report:
    """Everything measured, the table's rows and the pass/fail checks."""

    env: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (name, value, status)
    checks: list[dict[str, Any]] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine)  # CPU, torch, GPU: bench/machine.py
    budget: dict[str, float] = field(default_factory=dict)  # part -> seconds

    def row(self, name: str, value: str, ok: bool | None = None) -> None:
        """A table row; `ok` None is a measurement, True/False a check. Printed at once too, so
        a run cut short by a time limit still shows what it measured."""
        status = "-" if ok is None else ("PASS" if ok else "FAIL")
        self.rows.append((name, value, status))
        print(f"gpu_check: row | {name} | {value} | {status}", flush=True)
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
            "budget": self.budget,
            "env": self.env,
            "checks": self.checks,
            "ok": self.ok,
        }


def environment(plan: Plan) -> dict[str, Any]:
    """Device name and versions, printed above the table."""
    cuda = plan.device == "cuda"
    return {
        "dry_run": plan.dry_run,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if cuda else None,
        "gpus": torch.cuda.device_count() if cuda else 0,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "updates": plan.updates,
    }


# -- device helpers ---------------------------------------------------------------------------
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


def mib(value: float | None) -> str:
    return "n/a (CPU)" if value is None else f"{value / 1024:.2f} GiB"


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


@contextmanager
def timed(report: Report, part: str) -> Iterator[None]:
    """Adds the part's wall seconds to the report's budget."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        report.budget[part] = report.budget.get(part, 0.0) + time.perf_counter() - t0


# -- configuration ----------------------------------------------------------------------------
def compose(overrides: Sequence[str], output_dir: Path) -> TrainConfig:
    """The typed config of conf/train.yaml with `overrides`, as run.py hands it to train."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from convseq.cli.schema import register_configs
    from convseq.tasks.config import as_config

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="train", overrides=list(overrides))
    GlobalHydra.instance().clear()
    # Outside a Hydra run there is no runtime folder to interpolate: set it by hand.
    cfg.paths.output_dir = str(output_dir)
    return as_config(cfg)


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


def without_model(overrides: Sequence[str]) -> list[str]:
    """The corpus overrides less the model's (the big preset brings its own)."""
    return [o for o in overrides if not o.startswith("model")]


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
