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
from typing import Any

import torch
from torch.optim.optimizer import Optimizer

_LOW_PRECISION = (torch.float16, torch.bfloat16)


class NAG(Optimizer):
    """fairseq's NAG (``--optimizer nag``), as a plain ``torch.optim.Optimizer``.

    Args:
        params: parameters or parameter groups.
        lr: learning rate (fairseq's default recipe: 0.25).
        momentum: m in the update above (fairseq: 0.99).
        weight_decay: decoupled decay, scaled by lr at each step.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        if lr < 0.0:
            raise ValueError(f"NAG: lr must be >= 0, got {lr}")
        if momentum < 0.0:
            raise ValueError(f"NAG: momentum must be >= 0, got {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"NAG: weight_decay must be >= 0, got {weight_decay}")
        defaults = dict(lr=lr, lr_old=lr, momentum=momentum, weight_decay=weight_decay)
        super().__init__(params, defaults)

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
            lr_correct = lr / lr_old if lr_old != 0.0 else lr
            momentum = float(group["momentum"])
            weight_decay = float(group["weight_decay"])

            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("NAG does not support sparse gradients")
                low = p.dtype in _LOW_PRECISION
                # Low-precision weights are updated in float32 and rounded once at the end,
                # so that many tiny steps are not lost to bfloat16/float16 rounding.
                p32 = p.float() if low else p
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

                if weight_decay != 0.0:
                    p32.mul_(1.0 - lr * weight_decay)
                p32.add_(buf, alpha=momentum * momentum * lr_correct)
                p32.add_(grad, alpha=-(1.0 + momentum) * lr)
                buf.mul_(momentum * lr_correct).add_(grad, alpha=-lr)

                if low:
                    p.copy_(p32)

            group["lr_old"] = lr

        return loss

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
