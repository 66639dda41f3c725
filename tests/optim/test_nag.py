"""fairseq's NAG against its update written out by hand, and the optimiser builder."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from convseq.common.config import typed
from convseq.optim import NAG, OptimConfigError, build_optimizer
from convseq.optim.config import OPTIMIZER_DEFAULTS, OptimConfig


def _nag_by_hand(p, bufs, grad, lr, lr_old, m, wd):
    """fairseq's NAG step on plain Python floats (the reference formula, element by element)."""
    lr_correct = lr / lr_old
    new_p, new_buf = [], []
    for x, b, g in zip(p, bufs, grad):
        if wd != 0:
            x = x * (1 - lr * wd)
        x = x + m * m * lr_correct * b
        x = x - (1 + m) * lr * g
        new_p.append(x)
        new_buf.append(m * lr_correct * b - lr * g)
    return new_p, new_buf


def _step(opt: NAG, param: torch.Tensor, grad: list[float]) -> None:
    param.grad = torch.tensor(grad, dtype=param.dtype)
    opt.step()


def test_one_and_two_steps_match_literal_values():
    # p = 1, g = 0.5, lr 0.1, m 0.9:
    # step 1: p = 1 - 1.9 * 0.1 * 0.5 = 0.905, buf = -0.05
    # step 2: p = 0.905 + 0.81 * (-0.05) - 0.095 = 0.7695, buf = 0.9 * -0.05 - 0.05 = -0.095
    p = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = NAG([p], lr=0.1, momentum=0.9)
    _step(opt, p, [0.5])
    assert p.item() == pytest.approx(0.905, rel=1e-15)
    assert opt.state[p]["momentum_buffer"].item() == pytest.approx(-0.05, rel=1e-15)
    _step(opt, p, [0.5])
    assert p.item() == pytest.approx(0.7695, rel=1e-14)
    assert opt.state[p]["momentum_buffer"].item() == pytest.approx(-0.095, rel=1e-14)


def test_lr_change_rescales_the_velocity():
    # Step 1 as above; then lr 0.05, so lr_correct = 0.5:
    # p = 0.905 + 0.81 * 0.5 * (-0.05) - 1.9 * 0.05 * 0.5 = 0.83725
    # buf = 0.9 * 0.5 * (-0.05) - 0.05 * 0.5 = -0.0475; lr_old becomes 0.05
    p = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = NAG([p], lr=0.1, momentum=0.9)
    _step(opt, p, [0.5])
    opt.param_groups[0]["lr"] = 0.05
    _step(opt, p, [0.5])
    assert p.item() == pytest.approx(0.83725, rel=1e-14)
    assert opt.state[p]["momentum_buffer"].item() == pytest.approx(-0.0475, rel=1e-14)
    assert opt.param_groups[0]["lr_old"] == 0.05


def test_weight_decay_is_decoupled_and_scaled_by_lr():
    # p = 1 * (1 - 0.1 * 0.01) - 1.9 * 0.1 * 0.5 = 0.999 - 0.095 = 0.904 (an L2 term would give
    # 1 - 1.9 * 0.1 * (0.5 + 0.01) = 0.9031)
    p = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = NAG([p], lr=0.1, momentum=0.9, weight_decay=0.01)
    _step(opt, p, [0.5])
    assert p.item() == pytest.approx(0.904, rel=1e-14)


def test_several_steps_with_momentum_decay_and_lr_changes_match_the_formula():
    start = [0.7, -1.3, 0.25]
    grads = [
        [0.1, -0.2, 0.3],
        [0.05, 0.4, -0.1],
        [-0.3, 0.2, 0.0],
        [0.2, -0.1, 0.6],
        [0.0, 0.3, -0.2],
    ]
    lrs = [0.25, 0.25, 0.025, 0.0025, 0.01]  # annealed twice, then raised
    m, wd = 0.99, 1e-3
    p = torch.nn.Parameter(torch.tensor(start, dtype=torch.float64))
    opt = NAG([p], lr=lrs[0], momentum=m, weight_decay=wd)
    ref_p, ref_buf, lr_old = list(start), [0.0, 0.0, 0.0], lrs[0]
    for grad, lr in zip(grads, lrs):
        opt.param_groups[0]["lr"] = lr
        _step(opt, p, grad)
        ref_p, ref_buf = _nag_by_hand(ref_p, ref_buf, grad, lr, lr_old, m, wd)
        lr_old = lr
        assert p.tolist() == pytest.approx(ref_p, rel=1e-12, abs=1e-15)
        assert opt.state[p]["momentum_buffer"].tolist() == pytest.approx(
            ref_buf, rel=1e-12, abs=1e-15
        )


def test_float32_parameters_follow_the_formula():
    p = torch.nn.Parameter(torch.tensor([0.7, -1.3, 0.25]))
    opt = NAG([p], lr=0.25, momentum=0.99)
    ref_p, ref_buf = [0.7, -1.3, 0.25], [0.0, 0.0, 0.0]
    for grad in ([0.1, -0.2, 0.3], [0.05, 0.4, -0.1]):
        _step(opt, p, grad)
        ref_p, ref_buf = _nag_by_hand(ref_p, ref_buf, grad, 0.25, 0.25, 0.99, 0.0)
    assert p.tolist() == pytest.approx(ref_p, rel=1e-6)


def test_parameters_without_gradient_are_left_alone_and_closure_is_called():
    a = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    b = torch.nn.Parameter(torch.tensor([3.0]))
    opt = NAG([a, b], lr=0.1, momentum=0.9)
    a.grad = torch.tensor([1.0, 1.0])
    assert opt.step(lambda: 42.0) == 42.0
    assert b.tolist() == [3.0]
    assert b not in opt.state
    assert a.tolist() != [1.0, 2.0]


def test_bfloat16_weights_are_updated_in_float32():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.bfloat16))
    opt = NAG([p], lr=0.1, momentum=0.9)
    p.grad = torch.tensor([0.3, 0.7], dtype=torch.bfloat16)
    opt.step()
    g32 = torch.tensor([0.3, 0.7], dtype=torch.bfloat16).float()
    expected = torch.tensor([1.0, -2.0]) - 1.9 * 0.1 * g32
    assert p.dtype == torch.bfloat16
    assert torch.equal(p, expected.to(torch.bfloat16))
    buf = opt.state[p]["momentum_buffer"]
    assert buf.dtype == torch.float32
    assert torch.equal(buf, -0.1 * g32)


def _round_trip(state: dict) -> dict:
    stream = io.BytesIO()
    torch.save(state, stream)
    stream.seek(0)
    return torch.load(stream, weights_only=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_state_dict_round_trip_continues_identically(dtype):
    torch.manual_seed(0)
    start = torch.randn(3, 2).to(dtype)
    grads = [torch.randn(3, 2).to(dtype) for _ in range(6)]
    a = torch.nn.Parameter(start.clone())
    opt_a = NAG([a], lr=0.25, momentum=0.99, weight_decay=1e-4)
    for g in grads[:3]:
        a.grad = g.clone()
        opt_a.step()
    saved = _round_trip(opt_a.state_dict())

    # A fresh optimiser built with another lr: everything must come from the state dict.
    b = torch.nn.Parameter(a.detach().clone())
    opt_b = NAG([b], lr=1.0, momentum=0.99, weight_decay=1e-4)
    opt_b.load_state_dict(saved)
    assert opt_b.param_groups[0]["lr_old"] == 0.25
    buffer_dtype = torch.float32 if dtype == torch.bfloat16 else torch.float64
    assert opt_b.state[b]["momentum_buffer"].dtype == buffer_dtype
    for opt in (opt_a, opt_b):
        opt.param_groups[0]["lr"] = 0.025  # an anneal at the resume boundary
    for g in grads[3:]:
        a.grad, b.grad = g.clone(), g.clone()
        opt_a.step()
        opt_b.step()
    assert torch.equal(a, b)
    assert torch.equal(opt_a.state[a]["momentum_buffer"], opt_b.state[b]["momentum_buffer"])


def test_build_nag_sgd_adam():
    params = [torch.nn.Parameter(torch.zeros(2))]
    nag = build_optimizer(params, OptimConfig(name="nag", lr=0.5, momentum=0.9, weight_decay=1e-4))
    assert type(nag) is NAG
    assert (nag.defaults["lr"], nag.defaults["momentum"], nag.defaults["weight_decay"]) == (
        0.5,
        0.9,
        1e-4,
    )
    sgd = build_optimizer(params, dataclasses.replace(OPTIMIZER_DEFAULTS["sgd"], lr=0.25))
    assert type(sgd) is torch.optim.SGD
    assert sgd.defaults["momentum"] == 0.0 and sgd.defaults["lr"] == 0.25
    sgd_m = build_optimizer(params, OptimConfig(name="sgd", lr=0.25, momentum=0.9))
    assert sgd_m.defaults["momentum"] == 0.9
    adam = build_optimizer(params, OptimConfig(name="adam", lr=1e-3, betas=[0.9, 0.98], eps=1e-9))
    assert isinstance(adam, torch.optim.Adam | torch.optim.AdamW)
    assert adam.defaults["betas"] == (0.9, 0.98) and adam.defaults["eps"] == 1e-9


def test_build_from_composed_config():
    from tests.conftest import compose_config

    for name, cls in (("nag", NAG), ("sgd", torch.optim.SGD)):
        cfg = typed(OptimConfig, compose_config([f"optim={name}"]).optim, "optim")
        opt = build_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg)
        assert type(opt) is cls
        assert opt.defaults["momentum"] == {"nag": 0.99, "sgd": 0.0}[name]
    adam = build_optimizer(
        [torch.nn.Parameter(torch.zeros(1))],
        typed(OptimConfig, compose_config(["optim=adam"]).optim, "optim"),
    )
    assert type(adam) is torch.optim.AdamW
    assert adam.defaults["betas"] == (0.9, 0.999) and adam.defaults["lr"] == 0.001


def test_build_errors_name_the_key():
    params = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(OptimConfigError, match="optim.name='rmsprop'"):
        build_optimizer(params, OptimConfig(name="rmsprop", lr=0.1))
    with pytest.raises(OptimConfigError, match="optim.lr"):
        build_optimizer(params, OptimConfig(name="nag", lr=-1.0))
    with pytest.raises(OptimConfigError, match="optim.betas"):
        build_optimizer(params, OptimConfig(name="adam", lr=1e-3, betas=[0.9]))


# ---------------------------------------------------------------------------- the foreach path


class _OpCount(TorchDispatchMode):
    """The aten ops an optimiser step issues (a GPU launches a kernel for each)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not name.startswith("_record_function"):  # the profiler's markers around step()
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def _mixed_params(seed: int) -> list[torch.nn.Parameter]:
    """Parameters of three dtypes and several shapes, one without a gradient at times."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (5,), (3, 4, 2), (11,), (2, 3)]
    dtypes = [torch.float32, torch.float32, torch.float64, torch.bfloat16, torch.float32]
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(d)) for s, d in zip(shapes, dtypes)]


def test_foreach_nag_equals_the_per_parameter_nag_over_many_steps():
    """Mixed dtypes, weight decay, lr changes and a parameter that skips steps: the two paths
    give the same parameters and buffers (the same ops in the same order)."""
    runs = {}
    for foreach in (True, False):
        params = _mixed_params(0)
        opt = NAG(params, lr=0.25, momentum=0.99, weight_decay=1e-4, foreach=foreach)
        g = torch.Generator().manual_seed(1)
        for step in range(200):
            for i, p in enumerate(params):
                skip = i == 4 and step % 3 == 0  # no gradient at every third step
                grad = torch.randn(p.shape, generator=g).to(p.dtype)
                p.grad = None if skip else grad
            if step in (60, 130):
                opt.param_groups[0]["lr"] *= 0.1  # annealing between steps
            opt.step()
        runs[foreach] = (params, [opt.state[p]["momentum_buffer"] for p in params])
    for a, b in zip(runs[True][0] + runs[True][1], runs[False][0] + runs[False][1]):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_foreach_nag_issues_a_few_ops_per_dtype_not_four_per_parameter():
    def ops(foreach: bool) -> list[str]:
        params = [torch.nn.Parameter(torch.randn(3)) for _ in range(50)]
        opt = NAG(params, lr=0.1, momentum=0.9, foreach=foreach)
        for p in params:
            p.grad = torch.ones(3)
        opt.step()  # the first step also makes the buffers
        with _OpCount() as count:
            opt.step()
        return count.ops

    per_param, foreach = ops(False), ops(True)
    assert len(per_param) == 4 * 50  # add, add, mul, add on each of the 50 parameters
    assert len(foreach) == 4 and all(op.startswith("_foreach_") for op in foreach)


def test_build_optimizer_gives_the_foreach_nag():
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], OptimConfig(name="nag", lr=0.1))
    assert isinstance(opt, NAG) and opt.foreach
