"""fairseq's NAG optimiser: Nesterov momentum with the lr correction and decoupled weight decay.

Per parameter group, with lr the current learning rate, ``lr_old`` the one used at the previous
step (stored in the group, so it travels in ``state_dict()``), m the momentum and wd the weight
decay, each parameter p with gradient g and velocity buffer ``buf`` (zeros at first) becomes::

    lr_correct = lr / lr_old              (lr itself when lr_old is 0)
    p   <- p * (1 - lr * wd)              (only when wd != 0: decay scaled by lr, not an L2 term)
    p   <- p + m * m * lr_correct * buf
    p   <- p - (1 + m) * lr * g
    buf <- m * lr_correct * buf - lr * g

and ``lr_old <- lr`` once the group is done. ``buf`` holds the velocity already multiplied by lr,
so ``lr_correct`` rescales it when the annealing schedule changes lr between two steps. float16 and
bfloat16 parameters are updated through a float32 copy and their buffers are kept in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.optimizer import Optimizer

_LOW_PRECISION = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class _Coefficients:
    """One group's step: its lr, the lr correction, momentum and weight decay."""

    lr: float
    lr_correct: float
    momentum: float
    weight_decay: float


def _update_one(p: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor, c: _Coefficients) -> None:
    """The update of the module docstring on one parameter (in place)."""
    m = c.momentum
    if c.weight_decay != 0.0:
        p.mul_(1.0 - c.lr * c.weight_decay)
    p.add_(buf, alpha=m * m * c.lr_correct)
    p.add_(grad, alpha=-(1.0 + m) * c.lr)
    buf.mul_(m * c.lr_correct).add_(grad, alpha=-c.lr)


def _update_foreach(
    ps: list[torch.Tensor], grads: list[torch.Tensor], bufs: list[torch.Tensor], c: _Coefficients
) -> None:
    """The same update on lists of tensors of one device and dtype, the same ops in the same
    order (so the same rounding) as `_update_one`, one multi-tensor op each."""
    m = c.momentum
    if c.weight_decay != 0.0:
        torch._foreach_mul_(ps, 1.0 - c.lr * c.weight_decay)
    torch._foreach_add_(ps, bufs, alpha=m * m * c.lr_correct)
    torch._foreach_add_(ps, grads, alpha=-(1.0 + m) * c.lr)
    torch._foreach_mul_(bufs, m * c.lr_correct)
    torch._foreach_add_(bufs, grads, alpha=-c.lr)


def _buckets(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Indices of `tensors` grouped by (device, dtype), in first-seen order."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    return list(groups.values())


class NAG(Optimizer):
    """fairseq's NAG (``--optimizer nag``), as a plain ``torch.optim.Optimizer``.

    Args:
        params: parameters or parameter groups.
        lr: learning rate (fairseq's default recipe: 0.25).
        momentum: m in the update above (fairseq: 0.99).
        weight_decay: decoupled decay, scaled by lr at each step.
        foreach: update all tensors of one device and dtype with torch's multi-tensor
            (``torch._foreach_*``) ops: 4 ops per group instead of 4 per parameter, one kernel
            launch each on a GPU. False: the same formula one parameter at a time (the reference).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        foreach: bool = True,
    ) -> None:
        if lr < 0.0:
            raise ValueError(f"NAG: lr must be >= 0, got {lr}")
        if momentum < 0.0:
            raise ValueError(f"NAG: momentum must be >= 0, got {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"NAG: weight_decay must be >= 0, got {weight_decay}")
        defaults = dict(lr=lr, lr_old=lr, momentum=momentum, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.foreach = bool(foreach)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Apply one update to every parameter that has a gradient.

        Args:
            closure: optional; re-evaluates the model and returns the loss.

        Returns:
            The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = float(group["lr"])
            lr_old = float(group.get("lr_old", lr))
            coef = _Coefficients(
                lr=lr,
                lr_correct=lr / lr_old if lr_old != 0.0 else lr,
                momentum=float(group["momentum"]),
                weight_decay=float(group["weight_decay"]),
            )
            params, grads, bufs, low = self._gather(group)
            if self.foreach:
                for idx in _buckets(params):  # foreach ops need one device and dtype
                    pick = [(params[i], grads[i], bufs[i]) for i in idx]
                    _update_foreach(*map(list, zip(*pick)), coef)
            else:
                for p32, grad, buf in zip(params, grads, bufs):
                    _update_one(p32, grad, buf, coef)
            for p, p32 in low:
                p.copy_(p32)
            group["lr_old"] = lr
        return loss

    def _gather(self, group: dict[str, Any]) -> tuple[list, list, list, list]:
        """The tensors one group's update works on: the (float32 copies of low-precision)
        parameters, their gradients and velocity buffers, and the low-precision pairs to copy
        back."""
        params, grads, bufs, low = [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("NAG does not support sparse gradients")
            # Low-precision weights are updated in float32 and rounded once at the end,
            # so that many tiny steps are not lost to bfloat16/float16 rounding.
            p32 = p.float() if p.dtype in _LOW_PRECISION else p
            # float32 gradients for low-precision weights; float64 stays float64.
            grad = p.grad.float() if p.grad.dtype in _LOW_PRECISION else p.grad
            state = self.state[p]
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = torch.zeros_like(grad, memory_format=torch.preserve_format)
                state["momentum_buffer"] = buf
            elif buf.dtype != grad.dtype or buf.device != grad.device:
                buf = buf.to(grad)
                state["momentum_buffer"] = buf
            params.append(p32)
            grads.append(grad)
            bufs.append(buf)
            if p32 is not p:
                low.append((p, p32))
        return params, grads, bufs, low

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore buffers and ``lr_old``; buffers of low-precision weights stay float32.

        torch casts every floating state tensor to its parameter's dtype on load; that would round
        the float32 velocity of a bfloat16 weight, so those buffers are restored from the saved
        float32 values instead.
        """
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for index, saved in state_dict["state"].items():
            p = params[index]
            buf = saved.get("momentum_buffer")
            if p.dtype in _LOW_PRECISION and isinstance(buf, torch.Tensor):
                self.state[p]["momentum_buffer"] = buf.to(device=p.device, dtype=torch.float32)
