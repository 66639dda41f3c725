"""The measured choice between the band and unfold forms (`conv_windows.choose_unfold`): it keeps
the faster form of a shape class, honours a forced form, and keys its cache by shape class.
No test times anything real: the slow form is made slow on purpose."""

from __future__ import annotations

import time

import pytest
import torch

from convseq.modules import conv_windows
from convseq.modules.conv_windows import (
    MEASURED,
    FormKey,
    bucket,
    choose_unfold,
    conv_form,
    form_key,
    set_conv_form,
)
from convseq.modules.dynamic_conv import DynamicConv1dTBC
from convseq.modules.lightweight_conv import LightweightConv1dTBC


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Each test starts with no measured winner and the measuring mode, and leaves neither."""
    saved = dict(MEASURED)
    MEASURED.clear()
    old = set_conv_form("measure")
    yield
    set_conv_form(old)
    MEASURED.clear()
    MEASURED.update(saved)


def _forms(slow: str, calls: list[str]):
    """(band, unfold) functions of (x, w) recording their calls; ``slow`` sleeps 5 ms."""

    def make(name: str):
        def form(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            calls.append(name)
            if name == slow:
                time.sleep(0.005)
            return x * w.sum()

        return form

    return make("band"), make("unfold")


def _key(**changes) -> FormKey:
    base = FormKey("cpu", torch.float32, "DynamicConv1dTBC", 7, 16, 32, 8, False, 1)
    return base._replace(**changes)


INPUTS = (torch.ones(10, 2, 4), torch.ones(3))


@pytest.mark.parametrize("slow, unfold", [("band", True), ("unfold", False)])
def test_the_faster_form_is_chosen_and_kept(slow, unfold):
    calls: list[str] = []
    forms = _forms(slow, calls)
    assert choose_unfold(_key(), 10, forms, INPUTS) is unfold
    measured = len(calls)
    assert measured == 2 * (1 + conv_windows.MEASURE_REPEATS)  # one untimed, then timed
    assert choose_unfold(_key(), 12, forms, INPUTS) is unfold  # the same class: no new timing
    assert len(calls) == measured and MEASURED == {_key(): unfold}


def test_a_forced_form_is_honoured_and_nothing_is_measured():
    calls: list[str] = []
    forms = _forms("band", calls)
    with conv_form("band"):
        assert choose_unfold(_key(), 10, forms, INPUTS) is False
    with conv_form("unfold"):
        assert choose_unfold(_key(), 10, forms, INPUTS) is True
    with conv_form("length"):  # fairseq's rule
        assert choose_unfold(_key(), 10, forms, INPUTS) is False
        assert choose_unfold(_key(), 513, forms, INPUTS) is True
    assert calls == [] and MEASURED == {}
    with pytest.raises(ValueError, match="conv form"):
        set_conv_form("fastest")


def test_long_inputs_unfold_without_measuring_the_quadratic_band():
    calls: list[str] = []
    assert choose_unfold(_key(length=1024), 600, _forms("unfold", calls), INPUTS) is True
    assert calls == []


def test_each_shape_class_is_measured_once():
    calls: list[str] = []
    forms = _forms("band", calls)
    keys = [
        _key(),
        _key(dtype=torch.float64),
        _key(conv="LightweightConv1dTBC"),
        _key(kernel_size=31),
        _key(length=32),
        _key(rows=64),
        _key(backward=True),
    ]
    for key in keys * 2:
        choose_unfold(key, 10, forms, INPUTS)
    assert set(MEASURED) == set(keys)
    assert len(calls) == len(keys) * 2 * (1 + conv_windows.MEASURE_REPEATS)


def test_form_key_buckets_lengths_and_rows_and_tells_backward():
    x = torch.zeros(9, 3, 8)  # (T, B, C)
    key = form_key("DynamicConv1dTBC", x, 5, num_heads=2, backward=True)
    assert (key.length, key.rows, key.per_head, key.backward) == (16, 8, 4, True)
    assert form_key("DynamicConv1dTBC", x[:16], 5, 2, True) == key  # T 9 and 16 share
    assert bucket(1) == 1 and bucket(16) == 16 and bucket(17) == 32


def test_measuring_leaves_the_random_state_alone():
    conv = DynamicConv1dTBC(8, 3, padding_l=1, num_heads=2, weight_dropout=0.5).train()
    x = torch.randn(6, 2, 8, requires_grad=True)  # (T, B, C)
    torch.manual_seed(3)
    measured = conv(x)  # times both forms (each draws dropout masks), then runs the winner
    after_measured = torch.rand(3)
    (unfold,) = MEASURED.values()
    with conv_form("unfold" if unfold else "band"):
        torch.manual_seed(3)
        forced = conv(x)  # the winner alone, nothing timed
        after_forced = torch.rand(3)
    assert torch.equal(measured, forced) and torch.equal(after_measured, after_forced)


@pytest.mark.parametrize("cls", [LightweightConv1dTBC, DynamicConv1dTBC])
def test_layers_measure_in_the_full_forward_only(cls):
    conv = cls(8, 3, padding_l=2, num_heads=2)
    x = torch.randn(5, 2, 8)  # (T, B, C)
    full = conv(x)
    assert [k.conv for k in MEASURED] == [cls.__name__]
    state: dict = {}
    steps = torch.cat([conv(x[t : t + 1], incremental_state=state) for t in range(5)])
    torch.testing.assert_close(steps, full)
    assert len(MEASURED) == 1  # incremental steps unfold, unmeasured
