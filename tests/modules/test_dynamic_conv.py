"""`DynamicConv1dTBC`: the formula, its two forms, incremental decoding, fairseq's parameters."""

from __future__ import annotations

import itertools

import pytest
import torch

from convseq.modules.dynamic_conv import DynamicConv1dTBC, band_matrix, default_unfold

T, B, C, H, K = 7, 3, 8, 2, 4


def make(seed: int = 0, **kwargs) -> DynamicConv1dTBC:
    torch.manual_seed(seed)
    kwargs = {"kernel_size": K, "num_heads": H, "bias": True, **kwargs}
    conv = DynamicConv1dTBC(C, **kwargs).double()
    if conv.conv_bias is not None:  # zero at init: give it values the test can see
        torch.nn.init.normal_(conv.conv_bias)
    return conv


def inputs(length: int = T, seed: int = 1) -> torch.Tensor:
    return torch.randn(length, B, C, generator=torch.Generator().manual_seed(seed)).double()


def reference(conv: DynamicConv1dTBC, x: torch.Tensor) -> torch.Tensor:
    """The direct formula, one position at a time (no dropout)."""
    length, _, channels = x.shape
    heads, k, pad = conv.num_heads, conv.kernel_size, conv.padding_l
    r = channels // heads
    w = conv.weight_linear.weight
    b = conv.weight_linear.bias
    proj = x @ w.T + (0 if b is None else b)  # (T, B, out_features)
    if conv.in_proj:  # the convolved input is the projection's first C channels, then kernels
        x, proj = proj[..., :channels], proj[..., channels:]
    out = torch.zeros_like(x)
    for t in range(length):
        taps = [s for s in range(t - pad, t - pad + k)]
        valid = torch.tensor([0 <= s < length for s in taps])
        for h in range(heads):
            logits = proj[t, :, h * k : (h + 1) * k]  # (B, K): position t's kernel
            if conv.weight_softmax and conv.renorm_padding:
                logits = logits.masked_fill(~valid, float("-inf"))
            kernel = logits.softmax(-1) if conv.weight_softmax else logits
            for j, s in enumerate(taps):
                if valid[j]:
                    out[t, :, h * r : (h + 1) * r] += (
                        kernel[:, j : j + 1] * x[s, :, h * r : (h + 1) * r]
                    )
    if conv.conv_bias is not None:
        out = out + conv.conv_bias
    return out


SETTINGS = [
    {},
    {"weight_softmax": True},
    {"weight_softmax": True, "conv_bias": True},
    {"conv_bias": True, "bias": False},
    {"weight_softmax": True, "renorm_padding": True},
    {"in_proj": True, "weight_softmax": True},
]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("padding_l", [K - 1, (K - 1) // 2], ids=["decoder", "encoder"])
@pytest.mark.parametrize("unfold", [True, False], ids=["unfold", "band"])
def test_both_forms_compute_the_direct_formula(settings, padding_l, unfold):
    conv = make(padding_l=padding_l, **settings).eval()
    x = inputs()
    torch.testing.assert_close(conv(x, unfold=unfold), reference(conv, x))


@pytest.mark.parametrize(
    "softmax, conv_bias", list(itertools.product([False, True], [False, True]))
)
@pytest.mark.parametrize("length", [1, 3, T, 20])
def test_the_unfold_form_equals_the_band_form(softmax, conv_bias, length):
    for padding_l in (K - 1, 1, 0):
        conv = make(padding_l=padding_l, weight_softmax=softmax, conv_bias=conv_bias).eval()
        x = inputs(length)
        torch.testing.assert_close(conv(x, unfold=True), conv(x, unfold=False))


def test_the_band_matrix_places_each_kernel_on_its_diagonal():
    w = torch.arange(1.0, 1 + 2 * 3 * 4).view(2, 3, 4)  # (N, T, K)
    band = band_matrix(w, padding_l=1)  # column t - 1 + k
    expected = torch.zeros(2, 3, 3)
    for n, t, k in itertools.product(range(2), range(3), range(4)):
        if 0 <= t - 1 + k < 3:
            expected[n, t, t - 1 + k] = w[n, t, k]
    torch.testing.assert_close(band, expected)


def test_the_default_form_is_band_up_to_512_positions():
    assert not default_unfold(512) and default_unfold(513)


@pytest.mark.parametrize("settings", SETTINGS)
def test_one_step_at_a_time_equals_the_full_forward(settings):
    conv = make(**settings).eval()
    x = inputs(10)
    state: dict = {}
    steps = [conv(x[t : t + 1], incremental_state=state) for t in range(x.size(0))]
    torch.testing.assert_close(torch.cat(steps), conv(x))


@pytest.mark.parametrize("settings", SETTINGS)
def test_several_steps_at_once_equal_the_full_forward(settings):
    conv = make(**settings).eval()
    x = inputs(10)
    state: dict = {}
    chunks = [(0, 3), (3, 4), (4, 9), (9, 10)]  # several steps, one, several, one
    outs = [conv(x[a:b], incremental_state=state) for a, b in chunks]
    torch.testing.assert_close(torch.cat(outs), conv(x))


def test_kernel_size_one_decodes_without_a_cache():
    conv = make(kernel_size=1, padding_l=0).eval()
    x = inputs(5)
    state: dict = {}
    steps = [conv(x[t : t + 1], incremental_state=state) for t in range(5)]
    torch.testing.assert_close(torch.cat(steps), conv(x))
    assert state == {}


def test_incremental_decoding_needs_a_causal_convolution():
    conv = make(padding_l=1)
    with pytest.raises(ValueError, match="causal"):
        conv(inputs(1), incremental_state={})


def test_reorder_moves_the_cached_inputs_with_their_rows():
    conv = make(weight_softmax=True).eval()
    x = inputs(6)
    new_order = torch.tensor([2, 0, 0])
    state: dict = {}
    for t in range(4):
        conv(x[t : t + 1], incremental_state=state)
    conv.reorder_incremental_state(state, new_order)
    tail = [conv(x[t : t + 1, new_order], incremental_state=state) for t in (4, 5)]
    # as if the reordered rows had been decoded from the start
    torch.testing.assert_close(torch.cat(tail), conv(x[:, new_order])[4:])


def test_reorder_of_an_empty_state_does_nothing():
    state: dict = {}
    make().reorder_incremental_state(state, torch.tensor([0]))
    assert state == {}


@pytest.mark.parametrize("unfold", [True, False])
def test_weight_dropout_changes_the_output_in_training_only(unfold):
    conv = make(weight_dropout=0.5, weight_softmax=True)
    x = inputs()
    conv.eval()
    torch.testing.assert_close(conv(x, unfold=unfold), reference(conv, x))
    conv.train()
    torch.manual_seed(3)
    assert not torch.allclose(conv(x, unfold=unfold), reference(conv, x))


def test_a_separate_query_predicts_the_kernels():
    conv = make(query_size=5).eval()
    x, query = inputs(), torch.randn(T, B, 5).double()
    out = conv(x, query=query)
    # the kernels come from the query alone, so the output is linear in x
    torch.testing.assert_close(conv(2 * x, query=query), 2 * out)
    assert out.shape == (T, B, C)
    with pytest.raises(ValueError, match="in_proj"):
        make(in_proj=True)(x, query=x)


# fairseq 0.12's DynamicConv1dTBC: weight_linear = Linear(C, C + H*K) with in_proj (bias always),
# else Linear(query_size, H*K, bias=bias); conv_bias a Parameter (C,) when conv_bias.
PARAMETERS = [
    ({"bias": False}, {"weight_linear.weight": (H * K, C)}),
    ({"bias": True}, {"weight_linear.weight": (H * K, C), "weight_linear.bias": (H * K,)}),
    (
        {"bias": False, "conv_bias": True},
        {"weight_linear.weight": (H * K, C), "conv_bias": (C,)},
    ),
    (
        {"bias": False, "in_proj": True},
        {"weight_linear.weight": (C + H * K, C), "weight_linear.bias": (C + H * K,)},
    ),
    ({"bias": False, "query_size": 5}, {"weight_linear.weight": (H * K, 5)}),
]


@pytest.mark.parametrize("settings, shapes", PARAMETERS)
def test_parameters_are_named_and_shaped_as_fairseqs(settings, shapes):
    conv = make(**settings)
    assert {n: tuple(p.shape) for n, p in conv.state_dict().items()} == shapes
    assert conv.in_proj == bool(settings.get("in_proj"))
    fairseq_like = {n: torch.randn(s).double() for n, s in shapes.items()}
    conv.load_state_dict(fairseq_like, strict=True)


def test_initialisation_is_fairseqs():
    # fairseq's reset_parameters calls nn.Linear.reset_parameters: uniform within 1/sqrt(fan_in)
    # (it replaces the helper's xavier init); conv_bias zero
    conv = DynamicConv1dTBC(64, kernel_size=3, num_heads=4, bias=True, conv_bias=True)
    bound = 64**-0.5
    for p in (conv.weight_linear.weight, conv.weight_linear.bias):
        assert p.abs().max() <= bound and p.abs().max() > 0.8 * bound
    assert torch.equal(conv.conv_bias, torch.zeros(64))


@pytest.mark.parametrize("unfold", [True, False])
def test_gradients_match_finite_differences(unfold):
    torch.manual_seed(0)
    conv = DynamicConv1dTBC(
        4, kernel_size=3, num_heads=2, weight_softmax=True, bias=True, conv_bias=True
    ).double()
    x = torch.randn(4, 2, 4, dtype=torch.double, requires_grad=True)
    params = tuple(conv.parameters())

    def f(x, *ps):
        return torch.func.functional_call(
            conv, dict(zip([n for n, _ in conv.named_parameters()], ps)), (x,), {"unfold": unfold}
        )

    assert torch.autograd.gradcheck(f, (x, *[p.detach().requires_grad_() for p in params]))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="heads"):
        DynamicConv1dTBC(6, kernel_size=3, num_heads=4)
    with pytest.raises(ValueError, match="padding_l"):
        DynamicConv1dTBC(4, kernel_size=3, padding_l=3)


def trimmed_reference(conv: DynamicConv1dTBC, x: torch.Tensor) -> torch.Tensor:
    """fairseq's teacher-forced form for T < K, causal, softmax: each kernel cut to its last T
    taps, softmax over those, then taps t - T + 1 .. t (zeros before the sequence)."""
    length, _, channels = x.shape
    heads, k = conv.num_heads, conv.kernel_size
    r = channels // heads
    proj = x @ conv.weight_linear.weight.T + conv.weight_linear.bias  # (T, B, H * K)
    out = torch.zeros_like(x)
    for t in range(length):
        for h in range(heads):
            kernel = proj[t, :, h * k + k - length : (h + 1) * k].softmax(-1)  # (B, T)
            for j in range(length):
                s = t - length + 1 + j
                if s >= 0:
                    out[t, :, h * r : (h + 1) * r] += (
                        kernel[:, j : j + 1] * x[s, :, h * r : (h + 1) * r]
                    )
    return out


@pytest.mark.parametrize("length", [1, 2, K - 1])
@pytest.mark.parametrize("unfold", [True, False], ids=["unfold", "band"])
def test_trim_short_kernel_softmaxes_over_the_last_t_taps(length, unfold):
    conv = make(weight_softmax=True, trim_short_kernel=True).eval()
    x = inputs(length)
    out = conv(x, unfold=unfold)
    torch.testing.assert_close(out, trimmed_reference(conv, x))
    if length > 1:  # a real change: the untrimmed softmax spreads weight over K taps
        conv.trim_short_kernel = False
        assert not torch.allclose(out, conv(x, unfold=unfold))


@pytest.mark.parametrize(
    "settings, length",
    [
        ({"weight_softmax": True}, K),  # not shorter than the kernel
        ({"weight_softmax": True, "padding_l": (K - 1) // 2}, 2),  # centred
        ({}, 2),  # no softmax: the dropped taps only read zeros
        ({"weight_softmax": True, "renorm_padding": True}, 2),  # those taps are masked anyway
    ],
)
def test_trim_short_kernel_changes_nothing_elsewhere(settings, length):
    conv = make(trim_short_kernel=True, **settings).eval()
    x = inputs(length)
    for unfold in (True, False):
        torch.testing.assert_close(conv(x, unfold=unfold), reference(conv, x))


def test_trim_short_kernel_leaves_incremental_decoding_as_fairseqs():
    """fairseq's incremental form softmaxes over all K taps, whatever the length: so does ours."""
    conv = make(weight_softmax=True, trim_short_kernel=True).eval()
    x = inputs(K - 1)
    state: dict = {}
    steps = torch.cat([conv(x[t : t + 1], incremental_state=state) for t in range(K - 1)])
    torch.testing.assert_close(steps, reference(conv, x))
    assert "trim_short_kernel=True" in repr(conv)
