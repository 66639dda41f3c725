"""fconv's building blocks, each checked against maths written out in the test."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from convseq.modules.attention import AttentionLayer
from convseq.modules.beamable_mm import beamable_bmm
from convseq.modules.conv_tbc import ConvTBC
from convseq.modules.grad_multiply import grad_multiply
from convseq.modules.layers import linear, linearized_conv1d
from convseq.modules.linearized_conv import LinearizedConvolution
from convseq.modules.positional import LearnedPositionalEmbedding, make_positions
from convseq.modules.weight_norm import apply_weight_norm, assign_weight_, weight_norm_parts

PAD = 1


def test_positions_count_real_tokens_from_pad_plus_one():
    tokens = torch.tensor([[1, 1, 7, 8, 2], [7, 8, 9, 2, 1], [5, 6, 7, 8, 2]])
    expected = torch.tensor([[1, 1, 2, 3, 4], [2, 3, 4, 5, 1], [2, 3, 4, 5, 6]])
    assert torch.equal(make_positions(tokens, PAD), expected)


def test_positional_embedding_incremental_position_and_limit():
    emb = LearnedPositionalEmbedding(8, 3, PAD)  # usable: 8 - 1 - 1 = 6 positions
    assert emb.max_positions == 6
    prefix = torch.tensor([[2, 5, 6], [2, 7, 8]])
    last = emb(prefix, incremental=True)  # (2, 1, 3): position pad + 3 = 4
    assert last.shape == (2, 1, 3)
    assert torch.equal(last[0, 0], emb.weight[4]) and torch.equal(last[1, 0], emb.weight[4])
    assert torch.equal(emb(prefix)[:, -1:], last)  # same as the full numbering's last column
    with pytest.raises(ValueError, match="exceeds the 6 positions"):
        emb(torch.full((1, 7), 5))


def test_conv_tbc_is_a_cross_correlation_with_k_in_out_weights():
    torch.manual_seed(0)
    conv = ConvTBC(4, 6, 3, padding=1)
    nn.init.normal_(conv.bias)
    x = torch.randn(7, 2, 4)  # (T, B, C_in)
    out = conv(x)  # (T, B, C_out)
    padded = F.pad(x, (0, 0, 0, 0, 1, 1))  # (T + 2, B, C_in)
    # out[t] = bias + sum_j x_padded[t + j] @ W[j], written out
    expected = torch.stack(
        [conv.bias + sum(padded[t + j] @ conv.weight[j] for j in range(3)) for t in range(7)]
    )
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_linearized_conv_is_causal_and_steps_match_the_full_sequence():
    torch.manual_seed(0)
    conv = LinearizedConvolution(5, 8, 3)
    nn.init.normal_(conv.bias)
    x = torch.randn(6, 2, 5)  # (T, B, C)
    full = conv(x)  # (T, B, 8)
    assert full.shape == (6, 2, 8)
    # output t sees x[t-2 .. t] with zeros before the start, written out
    zero = torch.zeros(2, 5)
    for t in range(6):
        taps = [x[t - 2 + j] if t - 2 + j >= 0 else zero for j in range(3)]
        expected = conv.bias + sum(taps[j] @ conv.weight[j] for j in range(3))
        torch.testing.assert_close(full[t], expected, rtol=1e-5, atol=1e-6)
    state: dict = {}
    for t in range(6):
        step = conv(x[t].unsqueeze(1), state)  # (B, 1, 8)
        torch.testing.assert_close(step[:, 0], full[t], rtol=1e-5, atol=1e-6)
        if t == 3:  # swap the rows: their histories follow
            conv.reorder_incremental_state(state, torch.tensor([1, 0]))
            x = x[:, [1, 0]]
            full = full[:, [1, 0]]


def test_grad_multiply_scales_only_the_gradient():
    x = torch.randn(3, requires_grad=True)
    y = grad_multiply(x, 0.25)
    assert torch.equal(y, x)
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 0.25))


def test_weight_norm_uses_fairseq_names_order_and_maths():
    torch.manual_seed(0)
    m = apply_weight_norm(nn.Linear(4, 3), dim=0)
    sd = m.state_dict()
    assert list(sd) == ["bias", "weight_g", "weight_v"]
    assert sd["weight_g"].shape == (3, 1) and sd["weight_v"].shape == (3, 4)
    conv = apply_weight_norm(ConvTBC(4, 6, 3), dim=2)
    assert conv.state_dict()["weight_g"].shape == (1, 1, 6)  # one norm per output channel
    # loading fairseq-named tensors: W = g * v / ||v||, norm over (k, in) per output channel
    g = torch.rand(1, 1, 6) + 0.5
    v = torch.randn(3, 4, 6)
    conv.load_state_dict({"bias": torch.zeros(6), "weight_g": g, "weight_v": v}, strict=True)
    expected = g * v / v.pow(2).sum(dim=(0, 1), keepdim=True).sqrt()
    torch.testing.assert_close(conv.weight, expected)
    with pytest.raises(RuntimeError, match="Missing key"):
        conv.load_state_dict({"bias": torch.zeros(6), "weight_v": v}, strict=True)


def test_weight_norm_deepcopies_and_assigns_a_plain_weight():
    m = linear(5, 4, dropout=0.1)
    twin = copy.deepcopy(m)  # the legacy hook-based weight norm raises here
    x = torch.randn(2, 5)
    torch.testing.assert_close(twin(x), m(x))
    assert twin.parametrizations.weight.original1 is not m.parametrizations.weight.original1
    w = torch.randn(4, 5)
    assign_weight_(m, w)
    torch.testing.assert_close(m.weight, w)
    g, v = weight_norm_parts(m)
    torch.testing.assert_close(g, w.norm(dim=1, keepdim=True))


def test_initial_effective_weight_equals_the_drawn_weight():
    torch.manual_seed(0)
    conv = linearized_conv1d(16, 32, 3, dropout=0.2)
    g, v = weight_norm_parts(conv)
    torch.testing.assert_close(conv.weight, v)  # g = ||v|| at construction
    assert torch.equal(conv.bias, torch.zeros(32))


def _attention_by_hand(layer, x, emb, keys_bse, values, mask):
    """Reference section 1.4, one sentence and one target position at a time."""
    w_in, b_in = layer.in_projection.weight, layer.in_projection.bias
    w_out, b_out = layer.out_projection.weight, layer.out_projection.bias
    batch, steps, _ = x.shape
    out = torch.empty_like(x)
    for b in range(batch):
        real = [s for s in range(keys_bse.size(1)) if mask is None or not mask[b, s]]
        for t in range(steps):
            d = (x[b, t] @ w_in.T + b_in + emb[b, t]) * math.sqrt(0.5)
            scores = torch.stack([d @ keys_bse[b, s] for s in real])
            a = torch.softmax(scores, dim=0)
            c = sum(a[i] * values[b, s] for i, s in enumerate(real)) * math.sqrt(len(real))
            out[b, t] = (c @ w_out.T + b_out + x[b, t]) * math.sqrt(0.5)
    return out


@pytest.mark.parametrize("masked", [False, True])
def test_attention_layer_maths(masked):
    torch.manual_seed(0)
    layer = AttentionLayer(6, 4)
    x, emb = torch.randn(2, 3, 6), torch.randn(2, 3, 4)  # (B, T, C), (B, T, E)
    keys, values = torch.randn(2, 5, 4), torch.randn(2, 5, 4)  # (B, S, E)
    mask = torch.tensor([[True, True, False, False, False], [False] * 5]) if masked else None
    out, attn = layer(x, emb, (keys.transpose(1, 2), values), mask)
    expected = _attention_by_hand(layer, x, emb, keys, values, mask)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert attn.shape == (2, 3, 5)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 3))
    if masked:
        assert torch.equal(attn[0, :, :2], torch.zeros(3, 2))  # no weight on source pads


def test_beamable_bmm_shares_the_first_copy_of_each_beam():
    torch.manual_seed(0)
    beam, sentences = 3, 2
    a = torch.randn(beam * sentences, 1, 4)
    b_once = torch.randn(sentences, 4, 5)
    b = b_once.repeat_interleave(beam, dim=0)  # (6, 4, 5): identical copies per sentence
    torch.testing.assert_close(beamable_bmm(a, b, beam), torch.bmm(a, b))
    # it really reads only the first copy of each block: changing the others changes nothing
    b_other = b.clone()
    b_other[1] += 1.0
    torch.testing.assert_close(beamable_bmm(a, b_other, beam), torch.bmm(a, b))
    # shapes it cannot group fall back to bmm
    assert torch.equal(beamable_bmm(a[:5], b_other[:5], beam), torch.bmm(a[:5], b_other[:5]))
    a2 = torch.randn(6, 2, 4)
    assert torch.equal(beamable_bmm(a2, b_other, beam), torch.bmm(a2, b_other))
