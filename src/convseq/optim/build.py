"""Build the optimiser named by the `optim` config group: fairseq's NAG, plain SGD, or Adam."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from omegaconf import DictConfig

from convseq.common.plain import to_plain
from convseq.errors import ConvseqError
from convseq.optim.config import OPTIMIZER_DEFAULTS, OPTIMIZERS, OptimConfig
from convseq.optim.nag import NAG


class OptimConfigError(ConvseqError, ValueError):
    """The optim or anneal configuration names an unknown choice or holds a bad value."""


def number(cfg: Mapping[str, Any], group: str, key: str, default: float, minimum: float) -> float:
    """``cfg[key]`` as a float >= minimum, or a clear error naming ``group.key``."""
    value = cfg.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OptimConfigError(f"{group}.{key} must be a number, got {value!r}")
    if not value >= minimum:  # also refuses NaN
        raise OptimConfigError(f"{group}.{key} must be >= {minimum}, got {value!r}")
    return float(value)


def build_optimizer(
    params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
    optim_cfg: Mapping[str, Any] | DictConfig,
) -> torch.optim.Optimizer:
    """The optimiser ``optim_cfg`` asks for, over ``params``.

    - ``nag``: `convseq.optim.nag.NAG` (fairseq's), with lr, momentum and weight_decay.
    - ``sgd``: ``torch.optim.SGD`` with lr, momentum (0 unless given: the Lua toolkit's sgd) and
      weight_decay (an L2 term added to the gradient, torch's convention).
    - ``adam``: ``torch.optim.AdamW`` with lr, betas, eps and weight_decay. fairseq's adam decays
      weights decoupled from the gradient, which is torch's AdamW; with weight_decay 0 (the
      default) it is exactly Adam.

    ``clip_norm`` is not an optimiser setting: the trainer clips gradients before each step.
    A key missing from ``optim_cfg`` takes the optimiser's default
    (`convseq.optim.config.OPTIMIZER_DEFAULTS`, as conf/optim/<name>.yaml does).

    Args:
        params: parameters or parameter groups.
        optim_cfg: the `optim` config (OptimConfig fields), a DictConfig or a dict.

    Raises:
        OptimConfigError: an unknown ``optim.name`` or a bad value, named by its key.
    """
    cfg = dict(to_plain(optim_cfg) or {})
    name = cfg.get("name", OptimConfig.name)
    if name not in OPTIMIZERS:
        raise OptimConfigError(
            f"optim.name={name!r} is not an optimiser convseq knows; choose one of "
            f"{', '.join(OPTIMIZERS)} (e.g. optim=nag on the command line)"
        )
    defaults = OPTIMIZER_DEFAULTS[name]
    lr = number(cfg, "optim", "lr", defaults.lr, 0.0)
    weight_decay = number(cfg, "optim", "weight_decay", defaults.weight_decay, 0.0)
    if name in ("nag", "sgd"):
        momentum = number(cfg, "optim", "momentum", defaults.momentum, 0.0)
        optimizer = NAG if name == "nag" else torch.optim.SGD
        return optimizer(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    betas = cfg.get("betas", defaults.betas)
    if (
        not isinstance(betas, (list, tuple))
        or len(betas) != 2
        or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas)
    ):
        raise OptimConfigError(f"optim.betas must be two numbers in [0, 1), got {betas!r}")
    eps = number(cfg, "optim", "eps", defaults.eps, 0.0)
    return torch.optim.AdamW(
        params,
        lr=lr,
        betas=(float(betas[0]), float(betas[1])),
        eps=eps,
        weight_decay=weight_decay,
    )
