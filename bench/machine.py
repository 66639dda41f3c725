"""The machine a benchmark ran on: CPU model, the vector units that decide its speed, torch.

Figures from two CPUs are not comparable (an AMD EPYC with AVX-512 BF16/VNNI and an Intel Xeon
that also has AMX round and run the same kernels differently), so every benchmark prints
`machine_line()` at the top of its table and stores `machine()` in its JSON.

    python bench/machine.py        # the line and the JSON of this machine
"""

from __future__ import annotations

import json
import os
from typing import Any

# the CPU's name and flags: the library's (the training header prints the same name)
from convseq.common.machine import FLAGS, cpu_info, parse_cpuinfo

__all__ = ["FLAGS", "machine", "machine_line", "parse_cpuinfo"]


def machine() -> dict[str, Any]:
    """CPU model, its relevant flags, logical CPUs, torch version, threads and ATen's ISA level."""
    info = cpu_info()
    info["cpus"] = os.cpu_count()
    try:
        import torch

        info["torch"] = torch.__version__
        info["threads"] = torch.get_num_threads()
        info["aten_isa"] = torch.backends.cpu.get_cpu_capability()  # e.g. AVX512, AVX2
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    except ImportError:  # a benchmark peer's process may have no torch
        pass
    return info


def machine_line(info: dict[str, Any] | None = None) -> str:
    """One line for the top of a table: `CPU: <model> (<flags>), N CPUs, torch X, T threads`."""
    m = machine() if info is None else info
    flags = ", ".join(f.upper() for f in m.get("flags", [])) or "no AVX-512/AMX flags"
    parts = [f"CPU: {m['model']} ({flags})", f"{m.get('cpus')} CPUs"]
    if "torch" in m:
        threads = m.get("threads")
        plural = "" if threads == 1 else "s"
        isa = f" ({m['aten_isa']})" if m.get("aten_isa") else ""
        parts.append(f"torch {m['torch']}{isa}, {threads} thread{plural}")
    if "gpu" in m:
        parts.append(f"GPU: {m['gpu']}")
    return ", ".join(parts)


if __name__ == "__main__":
    print(machine_line())
    print(json.dumps(machine(), indent=1))
