"""LightConv encoder and decoder layers: fairseq 0.12's names, shapes and init, the layers'
maths against a step-by-step composition, padding, incremental decoding and reordering."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from convseq.modules.lightconv_layer import LightConvDecoderLayer, LightConvEncoderLayer
from convseq.modules.multihead_attention import MultiheadAttention

E, CONV, FFN, HEADS, K = 8, 12, 16, 2, 3
CONV_TYPES = ["lightweight", "dynamic"]


def encoder(conv_type: str, normalize_before: bool = False, **kw) -> LightConvEncoderLayer:
    return LightConvEncoderLayer(
        E, CONV, FFN, K, HEADS, conv_type=conv_type, normalize_before=normalize_before, **kw
    )


def decoder(conv_type: str, normalize_before: bool = False, **kw) -> LightConvDecoderLayer:
    return LightConvDecoderLayer(
        E, CONV, FFN, 4, HEADS, conv_type=conv_type, normalize_before=normalize_before, **kw
    )


def common_shapes(conv_type: str, kernel: int) -> dict[str, tuple[int, ...]]:
    """fairseq's names and shapes shared by both layers (linear1 doubled for the GLU)."""
    conv = {"lightweight": {"conv.weight": (HEADS, 1, kernel)}}
    # fairseq's DynamicConv_scripatable always holds a (1, 1, C) conv_bias, unused without bias
    conv["dynamic"] = {
        "conv.weight_linear.weight": (HEADS * kernel, CONV),
        "conv.conv_bias": (1, 1, CONV),
    }
    return {
        "linear1.weight": (2 * CONV, E),
        "linear1.bias": (2 * CONV,),
        **conv[conv_type],
        "linear2.weight": (E, CONV),
        "linear2.bias": (E,),
        "fc1.weight": (FFN, E),
        "fc1.bias": (FFN,),
        "fc2.weight": (E, FFN),
        "fc2.bias": (E,),
    }


def encoder_shapes(conv_type: str) -> dict[str, tuple[int, ...]]:
    norms = {f"layer_norm{i}.{p}": (E,) for i in (1, 2) for p in ("weight", "bias")}
    return {**common_shapes(conv_type, K), **norms}


def decoder_shapes(conv_type: str) -> dict[str, tuple[int, ...]]:
    names = ("conv_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")
    norms = {f"{n}.{p}": (E,) for n in names for p in ("weight", "bias")}
    attn = {f"encoder_attn.{p}_proj.weight": (E, E) for p in "qkv"}
    attn |= {f"encoder_attn.{p}_proj.bias": (E,) for p in "qkv"}
    attn |= {"encoder_attn.out_proj.weight": (E, E), "encoder_attn.out_proj.bias": (E,)}
    return {**common_shapes(conv_type, 4), **norms, **attn}


@pytest.mark.parametrize("conv_type", CONV_TYPES)
def test_names_and_shapes_are_fairseqs_and_load_strictly(conv_type):
    for layer, shapes in [
        (encoder(conv_type), encoder_shapes(conv_type)),
        (decoder(conv_type), decoder_shapes(conv_type)),
    ]:
        got = {name: tuple(t.shape) for name, t in layer.state_dict().items()}
        assert got == shapes
        state = {name: torch.randn(shape) for name, shape in shapes.items()}
        layer.load_state_dict(state, strict=True)
        for name, tensor in layer.state_dict().items():
            if name != "conv.conv_bias":  # unused: written back as zeros
                assert torch.equal(tensor, state[name])
    if conv_type == "dynamic":
        assert torch.count_nonzero(layer.state_dict()["conv.conv_bias"]) == 0
        bad = {**state, "conv.conv_bias": torch.zeros(CONV)}
        with pytest.raises(RuntimeError, match="conv_bias"):
            layer.load_state_dict(bad, strict=True)


def xavier_bound(weight: torch.Tensor, gain: float = 1.0) -> float:
    fan_out, fan_in = weight.shape
    return gain * math.sqrt(6.0 / (fan_in + fan_out))


def assert_xavier(weight: torch.Tensor, gain: float = 1.0) -> None:
    """Uniform in +-bound: the extremes reach near the bound and never past it."""
    bound = xavier_bound(weight, gain)
    assert weight.abs().max() <= bound
    assert weight.abs().max() > 0.9 * bound


def test_init_is_fairseqs():
    torch.manual_seed(0)
    layer = LightConvDecoderLayer(64, 64, 128, 3, 4, conv_type="dynamic")
    for name in ("linear1", "linear2", "fc1", "fc2"):
        linear = getattr(layer, name)
        assert_xavier(linear.weight)
        assert torch.count_nonzero(linear.bias) == 0
    attn = layer.encoder_attn
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert_xavier(proj.weight, gain=1 / math.sqrt(2))
        assert torch.count_nonzero(proj.bias) > 0  # PyTorch's default draw, as fairseq
    assert_xavier(attn.out_proj.weight)
    assert torch.count_nonzero(attn.out_proj.bias) == 0
    for norm in (layer.conv_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm):
        assert torch.equal(norm.weight, torch.ones(64)) and torch.count_nonzero(norm.bias) == 0
    uneven = MultiheadAttention(64, 4, kdim=32, vdim=32)
    assert_xavier(uneven.k_proj.weight)  # gain 1 when the sizes differ


def test_paddings_and_refusals():
    assert encoder("lightweight").conv.padding_l == K // 2
    assert LightConvEncoderLayer(E, CONV, FFN, 7, HEADS).conv.padding_l == 3
    assert decoder("dynamic").conv.padding_l == 3
    with pytest.raises(ValueError, match="odd kernel size"):
        LightConvEncoderLayer(E, CONV, FFN, 4, HEADS)
    with pytest.raises(ValueError, match="conv_type"):
        encoder("gated")
    assert "conv" in dict(decoder("lightweight", encoder_attention=False).named_children())
    assert decoder("lightweight", encoder_attention=False).encoder_attn is None


def randomize_norms(layer: torch.nn.Module) -> None:
    """Non-trivial layer-norm affines, so that the tests see which norm is applied where."""
    for module in layer.modules():
        if isinstance(module, torch.nn.LayerNorm):
            torch.nn.init.normal_(module.weight)
            torch.nn.init.normal_(module.bias)


def reference_encoder(layer, x, mask, before):
    """fairseq's encoder layer written step by step with the layer's own parameters."""

    def norm(ln, t):
        return F.layer_norm(t, (E,), ln.weight, ln.bias, 1e-5)

    residual = x
    h = norm(layer.layer_norm1, x) if before else x
    h = h @ layer.linear1.weight.T + layer.linear1.bias  # (T, B, 2 * CONV)
    h = h[..., :CONV] * torch.sigmoid(h[..., CONV:])  # GLU
    h = h * (~mask).T.unsqueeze(2)  # padded positions zeroed
    h = layer.conv(h)  # (T, B, CONV), the conv module's own forward
    h = h @ layer.linear2.weight.T + layer.linear2.bias
    x = residual + h
    x = x if before else norm(layer.layer_norm1, x)
    residual = x
    h = norm(layer.layer_norm2, x) if before else x
    h = torch.relu(h @ layer.fc1.weight.T + layer.fc1.bias)
    h = h @ layer.fc2.weight.T + layer.fc2.bias
    x = residual + h
    return x if before else norm(layer.layer_norm2, x)


def padding_mask(lengths: list[int], length: int) -> torch.Tensor:
    return torch.arange(length)[None, :] >= torch.tensor(lengths)[:, None]  # (B, T)


@pytest.mark.parametrize("conv_type", CONV_TYPES)
@pytest.mark.parametrize("before", [False, True])
def test_encoder_is_the_composition(conv_type, before):
    torch.manual_seed(1)
    layer = encoder(conv_type, before).eval()
    randomize_norms(layer)
    x = torch.randn(6, 3, E)
    mask = padding_mask([6, 4, 2], 6)
    with torch.no_grad():
        torch.testing.assert_close(layer(x, mask), reference_encoder(layer, x, mask, before))
        torch.testing.assert_close(layer(x), reference_encoder(layer, x, mask & False, before))


@pytest.mark.parametrize("conv_type", CONV_TYPES)
def test_encoder_padding_never_reaches_real_positions(conv_type):
    torch.manual_seed(2)
    layer = encoder(conv_type).eval()
    mask = padding_mask([5, 3], 5)
    x = torch.randn(5, 2, E)
    other = x.masked_fill(mask.T.unsqueeze(2), 0.0) + 7.0 * mask.T.unsqueeze(2)
    with torch.no_grad():
        a, b = layer(x, mask), layer(other, mask)
        real = ~mask.T  # (T, B)
        torch.testing.assert_close(a[real], b[real])
        assert not torch.allclose(layer(x)[real], layer(other)[real])  # without the mask it leaks


def decoder_inputs(rows: int = 3, length: int = 6, sources: int = 5):
    x = torch.randn(length, rows, E)
    encoder_out = torch.randn(sources, rows, E)
    mask = padding_mask([sources, 3, 2][:rows], sources)
    return x, encoder_out, mask


def incremental(layer, x, encoder_out, mask, chunks):
    state: dict = {}
    outs, attns, start = [], [], 0
    for size in chunks:
        out, attn = layer(x[start : start + size], encoder_out, mask, incremental_state=state)
        outs.append(out)
        attns.append(attn)
        start += size
    return torch.cat(outs), torch.cat(attns, dim=1), state


@pytest.mark.parametrize("conv_type", CONV_TYPES)
@pytest.mark.parametrize("before", [False, True])
def test_decoder_incremental_equals_full(conv_type, before):
    torch.manual_seed(3)
    layer = decoder(conv_type, before).eval()
    randomize_norms(layer)
    x, encoder_out, mask = decoder_inputs()
    with torch.no_grad():
        full, full_attn = layer(x, encoder_out, mask)
        for chunks in ([1] * 6, [2, 1, 3], [6]):
            out, attn, _ = incremental(layer, x, encoder_out, mask, chunks)
            torch.testing.assert_close(out, full)
            torch.testing.assert_close(attn, full_attn)


def test_decoder_is_causal():
    torch.manual_seed(4)
    layer = decoder("dynamic").eval()
    x, encoder_out, mask = decoder_inputs()
    changed = x.clone()
    changed[4:] += 1.0
    with torch.no_grad():
        a, _ = layer(x, encoder_out, mask)
        b, _ = layer(changed, encoder_out, mask)
    torch.testing.assert_close(a[:4], b[:4])
    assert not torch.allclose(a[4:], b[4:])


@pytest.mark.parametrize("conv_type", CONV_TYPES)
def test_reorder_moves_the_state(conv_type):
    torch.manual_seed(5)
    layer = decoder(conv_type).eval()
    x, encoder_out, mask = decoder_inputs()
    new_order = torch.tensor([2, 0, 0])
    with torch.no_grad():
        _, _, state = incremental(layer, x[:3], encoder_out, mask, [1, 2])
        layer.reorder_incremental_state(state, new_order)
        # the encoder output is not given again: the cached, reordered keys and values serve
        after, after_attn = layer(x[3:, new_order], None, None, incremental_state=state)
        full, full_attn = layer(x[:, new_order], encoder_out[:, new_order], mask[new_order])
    torch.testing.assert_close(after, full[3:])
    torch.testing.assert_close(after_attn, full_attn[:, 3:])


def test_attention_weights_sum_to_one_and_ignore_padded_keys():
    torch.manual_seed(6)
    layer = decoder("lightweight").eval()
    x, encoder_out, mask = decoder_inputs()
    with torch.no_grad():
        out, attn = layer(x, encoder_out, mask)
        assert attn.shape == (3, 6, 5) and attn.dtype == torch.float32
        torch.testing.assert_close(attn.sum(-1), torch.ones(3, 6))
        assert torch.all(attn.masked_select(mask[:, None, :].expand_as(attn)) == 0)
        noisy = encoder_out + 5.0 * mask.T.unsqueeze(2)  # padded keys and values change
        torch.testing.assert_close(layer(x, noisy, mask)[0], out)


def test_attention_is_the_formula():
    torch.manual_seed(7)
    attn = MultiheadAttention(E, HEADS)
    query, memory = torch.randn(4, 2, E), torch.randn(5, 2, E)
    out, weights = attn(query, memory, memory)
    d = E // HEADS
    q = attn.q_proj(query).view(4, 2, HEADS, d).permute(1, 2, 0, 3)  # (B, H, T, D)
    k = attn.k_proj(memory).view(5, 2, HEADS, d).permute(1, 2, 0, 3)  # (B, H, S, D)
    v = attn.v_proj(memory).view(5, 2, HEADS, d).permute(1, 2, 0, 3)  # (B, H, S, D)
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)  # (B, H, T, S)
    context = (p @ v).permute(2, 0, 1, 3).reshape(4, 2, E)  # (T, B, E)
    torch.testing.assert_close(out, attn.out_proj(context))
    torch.testing.assert_close(weights, p.mean(dim=1))


def test_need_attn_and_training():
    layer = decoder("lightweight")
    x, encoder_out, mask = decoder_inputs()
    assert layer(x, encoder_out, mask)[1] is None  # training: no weights, as fairseq
    layer.eval()
    assert layer(x, encoder_out, mask)[1] is not None
    layer.make_generation_fast_(need_attn=False)
    assert layer(x, encoder_out, mask)[1] is None


def test_dropout_only_in_training():
    torch.manual_seed(8)
    layer = decoder("dynamic", dropout=0.3, relu_dropout=0.3, input_dropout=0.3)
    layer.encoder_attn.dropout = 0.3
    x, encoder_out, mask = decoder_inputs()
    assert not torch.equal(layer(x, encoder_out, mask)[0], layer(x, encoder_out, mask)[0])
    layer.eval()
    with torch.no_grad():
        torch.testing.assert_close(layer(x, encoder_out, mask)[0], layer(x, encoder_out, mask)[0])


def test_gradients_reach_every_parameter():
    layer = encoder("dynamic", True)
    layer(torch.randn(5, 2, E), padding_mask([5, 3], 5)).sum().backward()
    assert all(p.grad is not None for p in layer.parameters())


def test_dynamic_layers_trim_short_kernels_as_fairseqs_model():
    """fairseq's layers build DynamicConv_scripatable (unfold form, trims when T < K)."""
    assert decoder("dynamic").conv.trim_short_kernel
    assert encoder("dynamic", False).conv.trim_short_kernel  # centred: never trims
