"""Scale a tensor's gradient without changing its value (fairseq's GradMultiply)."""

from __future__ import annotations

from typing import Any

import torch


class GradMultiply(torch.autograd.Function):
    """Identity in the forward pass; multiplies the incoming gradient by `scale` backwards."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.clone()  # a fresh tensor, like fairseq's x.new(x): later in-place ops stay local

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def grad_multiply(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x`` unchanged, with its gradient multiplied by ``scale`` on the way back."""
    return GradMultiply.apply(x, scale)
