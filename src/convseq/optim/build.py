"""Build the optimiser named by the `optim` config group: fairseq's NAG, plain SGD, or Adam."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from convseq.errors import ConvseqError
from convseq.optim.config import OPTIMIZERS, OptimConfig
from convseq.optim.nag import NAG


class OptimConfigError(ConvseqError, ValueError):
    """The optim or anneal configuration names an unknown choice or holds a bad value."""


def number(value: Any, name: str, minimum: float) -> float:
    """`value` as a float >= minimum, or a clear error naming the key `name` (``optim.lr``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OptimConfigError(f"{name} must be a number, got {value!r}")
    if not value >= minimum:  # also refuses NaN
        raise OptimConfigError(f"{name} must be >= {minimum}, got {value!r}")
    return float(value)


def build_optimizer(
    params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
    cfg: OptimConfig,
) -> torch.optim.Optimizer:
    """The optimiser ``cfg`` asks for, over ``params``.

    - ``nag``: `convseq.optim.nag.NAG` (fairseq's), with lr, momentum and weight_decay.
    - ``sgd``: ``torch.optim.SGD`` with lr, momentum (0 unless given: the Lua toolkit's sgd) and
      weight_decay (an L2 term added to the gradient, torch's convention).
    - ``adam``: ``torch.optim.AdamW`` with lr, betas, eps and weight_decay. fairseq's adam decays
      weights decoupled from the gradient, which is torch's AdamW; with weight_decay 0 (the
      default) it is exactly Adam.

    ``clip_norm`` is not an optimiser setting: the trainer clips gradients before each step.
    Each optimiser's own defaults are `convseq.optim.config.OPTIMIZER_DEFAULTS` (what
    conf/optim/<name>.yaml starts from).

    Args:
        params: parameters or parameter groups.
        cfg: the `optim` config.

    Raises:
        OptimConfigError: an unknown ``optim.name`` or a bad value, named by its key.
    """
    name = cfg.name
    if name not in OPTIMIZERS:
        raise OptimConfigError(
            f"optim.name={name!r} is not an optimiser convseq knows; choose one of "
            f"{', '.join(OPTIMIZERS)} (e.g. optim=nag on the command line)"
        )
    lr = number(cfg.lr, "optim.lr", 0.0)
    weight_decay = number(cfg.weight_decay, "optim.weight_decay", 0.0)
    if name in ("nag", "sgd"):
        momentum = number(cfg.momentum, "optim.momentum", 0.0)
        optimizer = NAG if name == "nag" else torch.optim.SGD
        return optimizer(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    betas = cfg.betas
    if (
        not isinstance(betas, (list, tuple))
        or len(betas) != 2
        or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas)
    ):
        raise OptimConfigError(f"optim.betas must be two numbers in [0, 1), got {betas!r}")
    eps = number(cfg.eps, "optim.eps", 0.0)
    return torch.optim.AdamW(
        params,
        lr=lr,
        betas=(float(betas[0]), float(betas[1])),
        eps=eps,
        weight_decay=weight_decay,
    )
