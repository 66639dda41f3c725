"""trainer.tf32: one key for CUDA's fp32 products, applied by dispatch for every task."""

from __future__ import annotations

import pytest
import torch

import convseq.cli.dispatch as dispatch_module
from convseq.common.tf32 import set_tf32, tf32_state
from tests.conftest import compose_config


@pytest.fixture(autouse=True)
def _restore():
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    yield
    torch.set_float32_matmul_precision(before[0])
    torch.backends.cudnn.allow_tf32 = before[1]


def test_set_tf32_sets_matrix_products_and_cudnn_together():
    set_tf32(False)
    assert torch.get_float32_matmul_precision() == "highest"
    assert torch.backends.cudnn.allow_tf32 is False and tf32_state() == "off"
    set_tf32(True)
    assert torch.get_float32_matmul_precision() == "high"
    assert torch.backends.cudnn.allow_tf32 is True and tf32_state() == "on"
    torch.backends.cudnn.allow_tf32 = False  # set apart by hand
    assert tf32_state() == "matmul only"


@pytest.mark.parametrize(("value", "state"), [("false", "off"), ("true", "on")])
def test_dispatch_applies_the_key_before_the_task_runs(monkeypatch, value, state):
    seen = []
    monkeypatch.setattr(dispatch_module, "task_function", lambda task: lambda cfg: seen.append(
        (cfg.trainer.tf32, tf32_state())
    ))  # fmt: skip
    set_tf32(value == "false")  # the opposite first: dispatch must change it
    dispatch_module.dispatch(compose_config([f"trainer.tf32={value}"], output_dir="/tmp/x"))
    assert seen == [(value == "true", state)]


def test_tf32_is_on_by_default():
    assert compose_config([]).trainer.tf32 is True
