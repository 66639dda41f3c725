"""The few lines a training run starts with: versions, machine, threads, precision, model size,
data, run folder (rank 0, through the `convseq.train` logger: stdout and run.log)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from convseq.common.cpu_share import threads_line
from convseq.common.machine import cpu_model
from convseq.common.tf32 import tf32_state
from convseq.common.threads import ThreadChoice, affinity
from convseq.inference.precision import device_type
from convseq.training.config import TrainConfig

__all__ = ["header_lines", "log_header"]

log = logging.getLogger("convseq.train")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("convseq")
    except Exception:  # a source tree that was never installed
        return "unknown"


def _data_line(meta: Mapping[str, Any]) -> str:
    """`train 1000 sentences, 12345/13000 tokens (de/en); valid ...` from a data-bin's meta."""
    src, tgt = meta.get("src_lang", "src"), meta.get("tgt_lang", "tgt")
    parts = []
    for name, info in (meta.get("splits") or {}).items():
        sents = info.get("sentences")
        s_tok = (info.get("src") or {}).get("tokens")
        t_tok = (info.get("tgt") or {}).get("tokens")
        tokens = f", {s_tok}/{t_tok} tokens" if s_tok is not None and t_tok is not None else ""
        parts.append(f"{name} {sents} sentences{tokens}")
    return f"data {src}->{tgt} (tokens {src}/{tgt}): " + "; ".join(parts) if parts else "data: ?"


def header_lines(
    cfg: TrainConfig,
    module: torch.nn.Module,
    data_meta: Mapping[str, Any],
    threads: ThreadChoice,
    output_dir: Path,
) -> list[str]:
    """The header's lines for the run of `cfg` (see the module docstring)."""
    tcfg = cfg.trainer
    machine = f"CPU {cpu_model()}, {len(affinity())} CPUs for this process"
    if torch.cuda.is_available():
        machine += f"; GPU {torch.cuda.get_device_name()}"
    params = sum(p.numel() for p in module.parameters())
    devices = f"{tcfg.accelerator} x {tcfg.devices} x {tcfg.num_nodes} nodes"
    cuda = device_type(tcfg.accelerator) == "cuda"
    # trainer.tf32 (default true) is set process-wide before this (convseq.common.tf32)
    tf32 = f"TF32 {tf32_state()} (trainer.tf32{'' if cuda else ', CUDA only: unused here'})"
    return [
        f"convseq {_version()}, torch {torch.__version__}, Lightning {pl.__version__}",
        machine,
        threads_line(threads.threads, threads.source),
        f"precision {tcfg.precision}, {tf32}, {devices}, strategy {tcfg.strategy}",
        f"model {cfg.model.arch}: {params:,} parameters",
        _data_line(data_meta),
        f"run folder {output_dir}",
    ]


def log_header(lines: list[str]) -> None:
    """Log the header's lines (the caller checks that this is rank 0)."""
    if not logging.getLogger().handlers and not log.handlers:  # no logging set up: stdout
        print("\n".join(f"convseq: {line}" for line in lines), flush=True)
        return
    for line in lines:
        log.info(line)
