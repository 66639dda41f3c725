"""Each optimiser's defaults are defined once: conf/optim/<name>.yaml and build_optimizer use them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from convseq.common.plain import to_plain
from convseq.optim import OPTIMIZERS, build_optimizer
from convseq.optim.config import OPTIMIZER_DEFAULTS, OptimConfig
from tests.conftest import compose_config


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_each_conf_optim_option_composes_to_its_defaults(name):
    composed = to_plain(compose_config([f"optim={name}"]).optim)
    assert composed == dataclasses.asdict(OPTIMIZER_DEFAULTS[name])
    assert composed["name"] == name


def test_build_optimizer_falls_back_on_the_optimizers_own_defaults():
    params = [torch.nn.Parameter(torch.zeros(2))]
    for name, defaults in OPTIMIZER_DEFAULTS.items():
        built = build_optimizer(params, {"name": name}).defaults
        assert built["lr"] == defaults.lr and built["weight_decay"] == defaults.weight_decay
        if name == "adam":
            assert built["betas"] == tuple(defaults.betas) and built["eps"] == defaults.eps
        else:
            assert built["momentum"] == defaults.momentum
    assert OPTIMIZER_DEFAULTS["sgd"].momentum == 0.0 and OPTIMIZER_DEFAULTS["adam"].lr == 0.001
    assert type(build_optimizer(params, {})).__name__ == "NAG" == OptimConfig.name.upper()
