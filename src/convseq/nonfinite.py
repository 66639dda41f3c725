"""Where a NaN or inf in training comes from: the first module, and the parameters, affected.

Used once training has already failed (fairseq's NanDetector does the same job): the forward
pass of the failing batch is run again with a hook on every module, and the first module whose
output holds a non-finite value is named; the parameters whose gradients are not finite are
listed from the gradients as they are. Nothing here runs during normal training.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn


def has_non_finite(value: Any) -> bool:
    """Whether a tensor (or a tuple, list or dict of them) holds a NaN or an inf."""
    if isinstance(value, torch.Tensor):
        return value.is_floating_point() and not bool(torch.isfinite(value).all())
    if isinstance(value, (tuple, list)):
        return any(has_non_finite(v) for v in value)
    if isinstance(value, dict):
        return any(has_non_finite(v) for v in value.values())
    return False


def first_non_finite_module(root: nn.Module, forward: Callable[[], Any]) -> str | None:
    """Run `forward()` (without gradients) and name the first module with a non-finite output.

    Hooks fire as modules finish, so the first one to fire on a NaN or inf is the module that
    produced it, not one that only passed it on. Weight-norm parametrizations are skipped: the
    layer that owns the weight is named instead.

    Args:
        root: the module whose submodules are watched (names are relative to it).
        forward: runs the forward pass to watch.

    Returns:
        The module's qualified name, or None when every output was finite.
    """
    found: list[str] = []

    def watch(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if not found and has_non_finite(output):
                found.append(name)

        return hook

    handles = [
        module.register_forward_hook(watch(name))
        for name, module in root.named_modules()
        if name and "parametrizations" not in name.split(".")
    ]
    try:
        with torch.no_grad():
            forward()
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None


def non_finite_gradients(named_parameters: Iterable[tuple[str, nn.Parameter]]) -> list[str]:
    """Names of the parameters whose gradient holds a NaN or an inf, in model order."""
    return [
        name
        for name, p in named_parameters
        if p.grad is not None and not bool(torch.isfinite(p.grad).all())
    ]
