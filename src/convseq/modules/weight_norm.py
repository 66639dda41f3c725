"""Weight normalisation with fairseq's parameter names (`weight_g`, `weight_v`).

The weight is ``g * v / ||v||``, the norm taken over every dim except ``dim``. It is built on
`torch.nn.utils.parametrizations.weight_norm`, which (unlike the legacy hook-based version) can be
deep-copied; that API stores the parts as ``parametrizations.weight.original0/1``. Two hooks on
the module translate those names, so ``state_dict()`` shows and ``load_state_dict()`` takes
exactly fairseq's ``bias, weight_g, weight_v``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm as _parametrize_weight_norm

_INNER = ("parametrizations.weight.original0", "parametrizations.weight.original1")
_OUTER = ("weight_g", "weight_v")


def _to_fairseq_names(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any
) -> None:
    # runs after the module's subtree was saved, so its keys are the last ones: popping and
    # re-adding keeps fairseq's order (bias, weight_g, weight_v) and everyone else's
    for inner, outer in zip(_INNER, _OUTER, strict=True):
        if prefix + inner in state_dict:
            state_dict[prefix + outer] = state_dict.pop(prefix + inner)


def _from_fairseq_names(
    module: nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    local_metadata: Any,
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    # runs before the module and its children read `state_dict` (a private copy)
    for inner, outer in zip(_INNER, _OUTER, strict=True):
        if prefix + outer in state_dict:
            state_dict[prefix + inner] = state_dict.pop(prefix + outer)


def apply_weight_norm(module: nn.Module, dim: int) -> nn.Module:
    """Weight-normalise ``module.weight`` over all dims but ``dim``, under fairseq's names.

    At the call ``g = ||weight||``, so the effective weight is unchanged.

    Args:
        module: a module with a ``weight`` parameter (Linear: dim 0; TBC convolution: dim 2).
        dim: the dim that keeps one norm per index (``weight_g`` has size 1 elsewhere).
    """
    _parametrize_weight_norm(module, name="weight", dim=dim)
    module.register_state_dict_post_hook(_to_fairseq_names)
    module.register_load_state_dict_pre_hook(_from_fairseq_names)
    return module


def is_weight_normed(module: nn.Module) -> bool:
    """Whether ``module.weight`` is weight-normalised."""
    return parametrize.is_parametrized(module, "weight")


def weight_norm_parts(module: nn.Module) -> tuple[nn.Parameter, nn.Parameter]:
    """The trainable parts ``(weight_g, weight_v)`` of a weight-normalised module."""
    parts = module.parametrizations.weight
    return parts.original0, parts.original1


@torch.no_grad()
def assign_weight_(module: nn.Module, weight: torch.Tensor) -> None:
    """Make the effective weight equal ``weight``: ``v = weight`` and ``g = ||weight||``.

    Useful to import a weight stored another way (e.g. one folded from a different norm dim).
    """
    if not is_weight_normed(module):
        module.weight.copy_(weight)
        return
    g, v = weight_norm_parts(module)
    if weight.shape != v.shape:
        raise ValueError(f"weight of shape {tuple(weight.shape)} for a {tuple(v.shape)} module")
    dim = module.parametrizations.weight[0].dim
    v.copy_(weight)
    g.copy_(torch.norm_except_dim(weight, 2, dim))
