"""LightweightConv1dTBC: a formula, its two forms, incremental decoding, fairseq's parameters."""

from __future__ import annotations

import pytest
import torch

from convseq.modules.lightweight_conv import LightweightConv1dTBC, default_unfold

# (kernel_size, padding_l): a causal decoder's and a centred encoder's settings
SETTINGS = [(3, 2), (3, 1), (4, 3), (4, 1), (1, 0)]


def _conv(
    kernel: int, padding: int, softmax: bool = False, bias: bool = True, **kwargs
) -> LightweightConv1dTBC:
    torch.manual_seed(0)
    conv = LightweightConv1dTBC(
        6, kernel, padding, num_heads=3, weight_softmax=softmax, bias=bias, **kwargs
    )
    if bias:
        with torch.no_grad():
            conv.bias.uniform_(-1, 1)  # a zero bias would test nothing
    return conv.eval()


def _expected(conv: LightweightConv1dTBC, x: torch.Tensor) -> torch.Tensor:
    """The convolution written out: out[t, b, c] = sum_k w[c // R, k] * x[t + k - P, b, c] + bias."""
    steps, rows, channels = x.shape
    per_head = channels // conv.num_heads
    weight = conv.weight.detach()[:, 0, :]  # (H, K)
    if conv.weight_softmax:
        weight = weight.exp() / weight.exp().sum(dim=1, keepdim=True)
    out = torch.zeros_like(x)
    for t in range(steps):
        for k in range(conv.kernel_size):
            source = t + k - conv.padding_l
            if 0 <= source < steps:
                for c in range(channels):
                    out[t, :, c] += weight[c // per_head, k] * x[source, :, c]
    if conv.bias is not None:
        out += conv.bias.detach()
    return out


@pytest.mark.parametrize("kernel,padding", SETTINGS)
@pytest.mark.parametrize("softmax", [False, True])
@pytest.mark.parametrize("unfold", [False, True])
def test_both_forms_give_the_written_out_convolution(kernel, padding, softmax, unfold):
    conv = _conv(kernel, padding, softmax)
    x = torch.randn(5, 2, 6)
    with torch.no_grad():
        out = conv(x, unfold=unfold)
    torch.testing.assert_close(out, _expected(conv, x))


def test_a_kernel_longer_than_the_sequence():
    conv = _conv(7, 6)
    x = torch.randn(3, 2, 6)
    with torch.no_grad():
        for unfold in (False, True):
            torch.testing.assert_close(conv(x, unfold=unfold), _expected(conv, x))


@pytest.mark.parametrize("kernel,padding", SETTINGS)
@pytest.mark.parametrize("softmax", [False, True])
def test_the_unfold_form_equals_the_band_form(kernel, padding, softmax):
    conv = _conv(kernel, padding, softmax)
    x = torch.randn(9, 3, 6)
    with torch.no_grad():
        torch.testing.assert_close(conv(x, unfold=True), conv(x, unfold=False))


def test_the_default_form():
    assert default_unfold(10, incremental=True)
    assert not default_unfold(10, incremental=False)
    assert default_unfold(10_000, incremental=False)


@pytest.mark.parametrize("kernel", [4, 1])
def test_one_step_at_a_time_equals_the_full_forward(kernel):
    conv = _conv(kernel, kernel - 1)
    x = torch.randn(7, 2, 6)
    state: dict = {}
    with torch.no_grad():
        steps = [conv(x[t : t + 1], incremental_state=state) for t in range(7)]
        torch.testing.assert_close(torch.cat(steps), conv(x))


@pytest.mark.parametrize("chunks", [[3, 4], [1, 5, 1], [7]])
def test_several_steps_at_once_equal_the_full_forward(chunks):
    conv = _conv(4, 3, softmax=True)
    x = torch.randn(7, 2, 6)
    state: dict = {}
    with torch.no_grad():
        parts, start = [], 0
        for size in chunks:
            parts.append(conv(x[start : start + size], incremental_state=state))
            start += size
        torch.testing.assert_close(torch.cat(parts), conv(x))


def test_incremental_decoding_needs_a_causal_convolution():
    conv = _conv(3, 1)
    with pytest.raises(ValueError, match="padding_l"):
        conv(torch.randn(1, 2, 6), incremental_state={})


def test_reorder_moves_the_state_with_the_beam():
    conv = _conv(3, 2)
    x = torch.randn(5, 3, 6)
    order = torch.tensor([2, 0, 0])
    state: dict = {}
    with torch.no_grad():
        for t in range(3):
            conv(x[t : t + 1], incremental_state=state)
        conv.reorder_incremental_state(state, order)
        moved = x[:, order]  # the rows each new row continues, from the start
        steps = [conv(x[t : t + 1, order], incremental_state=state) for t in (3, 4)]
        torch.testing.assert_close(torch.cat(steps), conv(moved)[3:])


def test_weight_dropout_changes_outputs_only_in_training():
    conv = _conv(3, 2, weight_dropout=0.5)
    x = torch.randn(6, 2, 6)
    with torch.no_grad():
        for unfold in (False, True):
            assert torch.equal(conv(x, unfold=unfold), conv(x, unfold=unfold))
            torch.testing.assert_close(conv(x, unfold=unfold), _expected(conv, x))
            conv.train()
            torch.manual_seed(1)
            assert not torch.allclose(conv(x, unfold=unfold), _expected(conv, x))
            conv.eval()


def test_parameters_are_named_shaped_and_initialised_as_fairseqs():
    # fairseq's LightweightConv1dTBC: weight (num_heads, 1, kernel_size), xavier_uniform;
    # bias (input_size,), zeros, only with bias=True; no other parameter or buffer
    conv = LightweightConv1dTBC(8, 5, 4, num_heads=2, weight_softmax=True, bias=True)
    state = conv.state_dict()
    assert {name: tuple(t.shape) for name, t in state.items()} == {
        "weight": (2, 1, 5),
        "bias": (8,),
    }
    assert torch.equal(conv.bias, torch.zeros(8))
    bound = (6 / (1 * 5 + 2 * 5)) ** 0.5  # xavier: fan_in = 1 * 5, fan_out = 2 * 5
    assert conv.weight.abs().max() <= bound
    assert set(LightweightConv1dTBC(8, 5, 4, bias=False).state_dict()) == {"weight"}
    conv.load_state_dict({"weight": torch.ones(2, 1, 5), "bias": torch.ones(8)}, strict=True)


@pytest.mark.parametrize("unfold", [False, True])
def test_gradients_flow(unfold):
    torch.manual_seed(0)
    conv = LightweightConv1dTBC(4, 3, 1, num_heads=2, weight_softmax=True, bias=True).double()
    x = torch.randn(4, 2, 4, dtype=torch.float64, requires_grad=True)

    def run(x, weight, bias):
        return torch.func.functional_call(
            conv, {"weight": weight, "bias": bias}, (x,), {"unfold": unfold}
        )

    weight = conv.weight.detach().clone().requires_grad_()
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(run, (x, weight, bias))


@pytest.mark.parametrize(
    "args",
    [(6, 0, 0), (6, 3, 3), (6, 3, -1), (6, 3, 2, 4), (6, 3, 2, 3, 1.0)],
)
def test_settings_it_cannot_honour_are_refused(args):
    with pytest.raises(ValueError):
        LightweightConv1dTBC(*args)
