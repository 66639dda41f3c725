"""TF32 on NVIDIA GPUs of compute capability 8.0 and newer (`trainer.tf32`).

TF32 multiplies fp32 tensors with a 10-bit mantissa and sums in fp32: on an A100 or H100 an fp32
matrix product runs on the tensor cores, several times faster, at about 1e-3 relative error per
product (bf16's products lose more). torch leaves it off for matrix products (its default
float32 matmul precision is "highest") and on for cuDNN convolutions; convseq sets both from one
key, on by default as most training frameworks recommend for Ampere and newer. It changes
nothing on a CPU or on older GPUs. `trainer.tf32=false` gives fp32 arithmetic throughout (what
`bench/gpu_check.py` compares with the CPU).
"""

from __future__ import annotations

import torch

__all__ = ["set_tf32", "tf32_state"]


def set_tf32(enabled: bool) -> None:
    """TF32 on (True) or off for CUDA matrix products and cuDNN convolutions, process-wide."""
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = bool(enabled)


def tf32_state() -> str:
    """What this process computes fp32 products with on a CUDA device: "on" or "off" (or
    "matmul only" / "cuDNN only" when set apart by hand)."""
    matmul = torch.get_float32_matmul_precision() != "highest"
    cudnn = bool(torch.backends.cudnn.allow_tf32)
    if matmul and cudnn:
        return "on"
    if not matmul and not cudnn:
        return "off"
    return "matmul only" if matmul else "cuDNN only"
