"""Where a NaN or inf in training comes from: the first module, and the parameters, affected.

Used once training has already failed (fairseq's NanDetector does the same job): the forward
pass of the failing batch is run again with a hook on every module, and the first module whose
output holds a non-finite value is named; the parameters whose gradients are not finite are
listed from the gradients as they are. Nothing here runs during normal training.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from convseq.errors import NonFiniteError


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


def non_finite_error(
    module: Any, gnorm: torch.Tensor, loss: torch.Tensor, gnorm_ok: bool
) -> NonFiniteError:
    """The error for a non-finite update of a `ConvSeqModule`, naming the step, the first
    module whose output is not finite (its last batch re-run) and the bad parameters."""
    what = []
    if not math.isfinite(float(loss)):
        what.append(f"the loss is {float(loss)}")
    if not gnorm_ok:
        what.append(f"the gradient norm is {float(gnorm)}")
    where = f"at update {module.global_step + 1} (epoch {module.current_epoch + 1})"
    bad_grads = non_finite_gradients(module.named_parameters())
    first = None
    last_batch = module._last_batch
    if last_batch is not None:  # re-run the update's last batch, watching every module
        first = first_non_finite_module(module, lambda: module._batch_sums(last_batch))
    found = []
    if first is not None:
        found.append(f"first non-finite output: {first} (the update's last batch, re-run)")
    elif last_batch is not None:
        found.append("every module's output is finite when the update's last batch is re-run")
    if bad_grads:
        more = f" and {len(bad_grads) - 3} more" if len(bad_grads) > 3 else ""
        found.append(f"non-finite gradients in {', '.join(bad_grads[:3])}{more}")
    detail = f" ({'; '.join(found)})" if found else ""
    return NonFiniteError(
        f"{' and '.join(what)} {where}{detail}; training stopped, and last.ckpt and "
        "best.ckpt still hold the state before it. Lower optim.lr or optim.clip_norm, and "
        "resume from the last checkpoint (resume=true)."
    )
