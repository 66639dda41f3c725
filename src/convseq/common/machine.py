"""The CPU this process runs on, as /proc/cpuinfo names it (one home for the benchmarks' machine
line and the start-up header of a training run)."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

__all__ = ["FLAGS", "cpu_model", "parse_cpuinfo"]

# The flags (as /proc/cpuinfo spells them) that change which kernels oneDNN and ATen run:
# bf16 autocast and int8 weights are fast only where these exist.
FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """The model name and the FLAGS present, from the text of /proc/cpuinfo (first processor)."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {"model": model, "flags": [f for f in FLAGS if f in flags]}


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """`parse_cpuinfo` of this machine; without /proc/cpuinfo (macOS), the platform's name."""
    info: dict[str, Any] = {"model": platform.processor() or platform.machine(), "flags": []}
    if cpuinfo.is_file():
        parsed = parse_cpuinfo(cpuinfo.read_text(encoding="utf-8", errors="replace"))
        info.update({k: v for k, v in parsed.items() if v})
    return info


def cpu_model() -> str:
    """This machine's CPU model, e.g. `AMD EPYC 9R14 96-Core Processor`."""
    return str(cpu_info()["model"])
