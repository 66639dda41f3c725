"""Each optimiser's defaults are defined once: conf/optim/<name>.yaml and build_optimizer use them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from convseq.common.config import plain
from convseq.optim import OPTIMIZERS, build_optimizer
from convseq.optim.config import OPTIMIZER_DEFAULTS, OptimConfig
from tests.conftest import compose_config


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_each_conf_optim_option_composes_to_its_defaults(name):
    composed = plain(compose_config([f"optim={name}"]).optim)
    assert composed == dataclasses.asdict(OPTIMIZER_DEFAULTS[name])
    assert composed["name"] == name


def test_build_optimizer_builds_each_optimizers_own_defaults():
    # a typed OptimConfig has no missing key: a caller starts from OPTIMIZER_DEFAULTS[name]
    params = [torch.nn.Parameter(torch.zeros(2))]
    for name, defaults in OPTIMIZER_DEFAULTS.items():
        built = build_optimizer(params, defaults).defaults
        assert built["lr"] == defaults.lr and built["weight_decay"] == defaults.weight_decay
        if name == "adam":
            assert built["betas"] == tuple(defaults.betas) and built["eps"] == defaults.eps
        else:
            assert built["momentum"] == defaults.momentum
    assert OPTIMIZER_DEFAULTS["sgd"].momentum == 0.0 and OPTIMIZER_DEFAULTS["adam"].lr == 0.001
    # replacing one setting keeps the optimiser's other defaults
    sgd = build_optimizer(params, dataclasses.replace(OPTIMIZER_DEFAULTS["sgd"], lr=0.1))
    assert (sgd.defaults["lr"], sgd.defaults["momentum"]) == (0.1, 0.0)
    assert (
        type(build_optimizer(params, OptimConfig())).__name__ == "NAG" == OptimConfig.name.upper()
    )
    assert OptimConfig() == OPTIMIZER_DEFAULTS["nag"]  # NAG's defaults are the schema's own
