"""LightConvModel and LightConvConfig against fairseq 0.12's LightConv (values written here from
``fairseq/models/lightconv.py``) and against themselves (incremental against full)."""

from __future__ import annotations

import math

import pytest
import torch

from convseq.models.lightconv import LightConvModel
from convseq.models.lightconv_config import PRESETS, LightConvConfig, preset
from convseq.modules.positional import SinusoidalPositionalEmbedding

PAD = 1

# fairseq 0.12 base_architecture, then each @register_model_architecture's values.
BASE = dict(
    encoder_embed_dim=512, encoder_ffn_embed_dim=2048, encoder_layers=7,
    encoder_attention_heads=8, decoder_embed_dim=512, decoder_ffn_embed_dim=2048,
    decoder_layers=6, decoder_attention_heads=8, dropout=0.1, attention_dropout=0.0,
    relu_dropout=0.0, input_dropout=0.1, weight_dropout=0.0, encoder_glu=True,
    decoder_glu=True, encoder_conv_type="dynamic", decoder_conv_type="dynamic",
    weight_softmax=True, encoder_normalize_before=False, decoder_normalize_before=False,
    encoder_learned_pos=False, decoder_learned_pos=False, encoder_conv_dim=512,
    decoder_conv_dim=512, decoder_output_dim=512, max_source_positions=1024,
    max_target_positions=1024, share_all_embeddings=False,
    share_decoder_input_output_embed=False, no_token_positional_embeddings=False,
    encoder_kernel_size_list=(3, 7, 15, 31, 31, 31, 31),
    decoder_kernel_size_list=(3, 7, 15, 31, 31, 31),
)  # fmt: skip
BIG = dict(
    BASE, attention_dropout=0.1, weight_dropout=0.1, encoder_embed_dim=1024,
    encoder_ffn_embed_dim=4096, encoder_attention_heads=16, decoder_embed_dim=1024,
    decoder_ffn_embed_dim=4096, decoder_attention_heads=16, dropout=0.3, encoder_conv_dim=1024,
    decoder_conv_dim=1024, decoder_output_dim=1024,
)  # fmt: skip
EXPECTED = {
    "lightconv_iwslt_de_en": dict(
        BASE, encoder_ffn_embed_dim=1024, encoder_attention_heads=4, decoder_ffn_embed_dim=1024,
        decoder_attention_heads=4, attention_dropout=0.1, weight_dropout=0.1, encoder_glu=False,
        decoder_glu=False, input_dropout=0.0,
    ),
    "lightconv_wmt_en_de": BASE,
    "lightconv_wmt_en_de_big": BIG,
    "lightconv_wmt_en_fr_big": dict(BIG, dropout=0.1),
    "lightconv_wmt_zh_en_big": dict(BIG, dropout=0.2, attention_dropout=0.2, weight_dropout=0.2),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_presets_carry_fairseqs_values(name: str) -> None:
    cfg = preset(name)
    for key, value in EXPECTED[name].items():
        assert getattr(cfg, key) == value, (name, key)
    assert set(PRESETS) == set(EXPECTED)


def tiny(conv_type: str = "lightweight", **kw: object) -> LightConvConfig:
    base = dict(
        encoder_embed_dim=8, encoder_ffn_embed_dim=12, encoder_layers=2,
        encoder_attention_heads=2, encoder_kernel_size_list=(3, 5), decoder_layers=2,
        decoder_attention_heads=2, decoder_kernel_size_list=(3, 5), encoder_conv_type=conv_type,
        decoder_conv_type=conv_type, max_source_positions=32, max_target_positions=32,
    )  # fmt: skip
    return LightConvConfig(**{**base, **kw})  # type: ignore[arg-type]


def layer_keys(side: str, i: int, kernel: int, glu: bool = True) -> dict[str, tuple[int, ...]]:
    """fairseq's LightConv{Encoder,Decoder}Layer entries for E = conv = 8, FFN 12, 2 heads,
    a dynamic convolution (weight_linear: heads * K outputs, conv_bias (1, 1, conv))."""
    p = f"{side}.layers.{i}."
    keys = {
        p + "linear1.weight": (16 if glu else 8, 8), p + "linear1.bias": (16 if glu else 8,),
        p + "conv.weight_linear.weight": (2 * kernel, 8), p + "conv.conv_bias": (1, 1, 8),
        p + "linear2.weight": (8, 8), p + "linear2.bias": (8,),
        p + "fc1.weight": (12, 8), p + "fc1.bias": (12,), p + "fc2.weight": (8, 12),
        p + "fc2.bias": (8,),
    }  # fmt: skip
    norms = ["layer_norm1", "layer_norm2"]
    if side == "decoder":
        norms = ["conv_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"]
        for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
            keys[p + f"encoder_attn.{proj}.weight"] = (8, 8)
            keys[p + f"encoder_attn.{proj}.bias"] = (8,)
    for norm in norms:
        keys[p + f"{norm}.weight"] = (8,)
        keys[p + f"{norm}.bias"] = (8,)
    return keys


def test_state_dict_keys_and_shapes_are_fairseqs() -> None:
    cfg = tiny("dynamic", encoder_learned_pos=True, decoder_normalize_before=True)
    sd = LightConvModel.build(cfg, 11, 13, pad=PAD).state_dict()
    expected: dict[str, tuple[int, ...]] = {
        "encoder.version": (1,), "encoder.embed_tokens.weight": (11, 8),
        "encoder.embed_positions.weight": (32 + PAD + 1, 8), "decoder.version": (1,),
        "decoder.embed_tokens.weight": (13, 8), "decoder.output_projection.weight": (13, 8),
        "decoder.layer_norm.weight": (8,), "decoder.layer_norm.bias": (8,),
    }  # fmt: skip
    for side in ("encoder", "decoder"):
        for i, kernel in enumerate((3, 5)):
            expected.update(layer_keys(side, i, kernel))
    assert {k: tuple(v.shape) for k, v in sd.items()} == expected


def test_tied_and_projected_outputs() -> None:
    model = LightConvModel.build(tiny(share_all_embeddings=True), 11, 11)
    assert model.decoder.embed_tokens is model.encoder.embed_tokens
    assert model.decoder.output_projection.weight is model.encoder.embed_tokens.weight
    sd = LightConvModel.build(tiny(decoder_output_dim=6), 11, 13).state_dict()
    assert sd["decoder.project_out_dim.weight"].shape == (6, 8)
    assert sd["decoder.output_projection.weight"].shape == (13, 6)


def test_embedding_init() -> None:
    torch.manual_seed(0)
    cfg = tiny(encoder_embed_dim=64, decoder_learned_pos=True)
    model = LightConvModel.build(cfg, 2000, 2000, pad=PAD)
    for table in (model.encoder.embed_tokens.weight, model.decoder.embed_positions.weight):
        assert torch.all(table[PAD] == 0)
        rest = torch.cat([table[:PAD], table[PAD + 1 :]])
        assert rest.std().item() == pytest.approx(64**-0.5, rel=0.05)
        assert rest.mean().abs().item() < 0.01
    out = model.decoder.output_projection.weight
    assert out.std().item() == pytest.approx(64**-0.5, rel=0.05)
    assert model.encoder.embed_scale == math.sqrt(64)


@pytest.mark.parametrize("dim", [6, 7])
def test_sinusoidal_positions_follow_the_formula(dim: int) -> None:
    emb = SinusoidalPositionalEmbedding(dim, PAD, init_size=4)  # grows past 4 rows
    tokens = torch.tensor([[PAD, PAD, 5, 6, 7], [5, 6, 7, 8, 9]])
    out = emb(tokens)  # (2, 5, dim)
    half = dim // 2
    for b, row in enumerate(tokens.tolist()):
        real = [t != PAD for t in row]
        pos = [PAD + sum(real[: t + 1]) if real[t] else PAD for t in range(len(row))]
        for t, p in enumerate(pos):
            want = torch.zeros(dim)
            if p != PAD:
                for i in range(half):
                    freq = math.exp(-i * math.log(10000) / (half - 1))
                    want[i], want[half + i] = math.sin(p * freq), math.cos(p * freq)
            torch.testing.assert_close(out[b, t], want, atol=1e-5, rtol=0)
    assert emb(tokens[1:], incremental=True)[0, 0].tolist() == out[1, 4].tolist()
    assert list(emb.state_dict()) == []


def batch(src_vocab: int = 11, tgt_vocab: int = 13) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    src = torch.randint(4, src_vocab, (3, 6))
    src[0, :2] = PAD  # left-padded source
    prev = torch.randint(4, tgt_vocab, (3, 8))  # T = 8 >= the largest kernel, 5
    return src, prev


@pytest.mark.parametrize("conv_type", ["lightweight", "dynamic"])
@pytest.mark.parametrize("chunks", [[1] * 8, [3, 1, 4], [8]])
def test_incremental_equals_teacher_forced(conv_type: str, chunks: list[int]) -> None:
    """Fed one step or several at once, the decoder gives the full forward's logits. For a
    dynamic convolution with T < K the full forward trims the kernel as fairseq does and
    differs from the incremental form (docs/model.md); here T = 8 >= K = 5."""
    torch.manual_seed(0)
    model = LightConvModel.build(tiny(conv_type, decoder_learned_pos=True), 11, 13).eval()
    src, prev = batch()
    with torch.no_grad():
        full, _ = model(src, None, prev)  # (B, T, V)
        enc = model.encoder(src)
        state: dict[str, object] = {}
        steps, end = [], 0
        for n in chunks:
            end += n
            logits, _ = model.decoder(prev[:, :end], enc, incremental_state=state)
            assert logits.shape == (3, n, 13)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("conv_type", ["lightweight", "dynamic"])
def test_source_padding_leaves_real_positions_alone(conv_type: str) -> None:
    torch.manual_seed(0)
    model = LightConvModel.build(tiny(conv_type), 11, 13).eval()
    src, prev = batch()
    padded = torch.cat([torch.full((3, 3), PAD), src], 1)  # 3 more pads on the left
    with torch.no_grad():
        enc, enc_padded = model.encoder(src), model.encoder(padded)
        torch.testing.assert_close(enc_padded.encoder_out[3:], enc.encoder_out, atol=1e-5, rtol=0)
        torch.testing.assert_close(
            model(padded, None, prev)[0], model(src, None, prev)[0], atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("conv_type", ["lightweight", "dynamic"])
def test_reorder_moves_the_state(conv_type: str) -> None:
    torch.manual_seed(0)
    model = LightConvModel.build(tiny(conv_type), 11, 13).eval()
    src, prev = batch()
    order = torch.tensor([2, 0, 0])
    with torch.no_grad():
        full, _ = model(src[order], None, prev[order])
        enc = model.encoder(src)
        state: dict[str, object] = {}
        first, _ = model.decoder(prev[:, :4], enc, incremental_state=state)
        model.decoder.reorder_incremental_state(state, order)
        rest, _ = model.decoder(prev[order], enc.reorder(order), incremental_state=state)
    torch.testing.assert_close(first[order], full[:, :4], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rest, full[:, 4:], atol=1e-5, rtol=1e-5)


def test_dynamic_short_target_is_fairseqs_exception() -> None:
    """T < K with a dynamic convolution: the teacher-forced form trims the kernel to the last T
    taps before its softmax (fairseq 0.12's unfold form), the incremental form does not, so the
    two differ there as they do in fairseq (docs/model.md, "Sequences shorter than the kernel");
    a lightweight convolution has no such case."""
    src, prev = batch()
    short = prev[:, :3]  # T = 3 < K = 5 in the second decoder layer
    for conv_type, same in (("lightweight", True), ("dynamic", False)):
        torch.manual_seed(0)
        model = LightConvModel.build(tiny(conv_type), 11, 13).eval()
        with torch.no_grad():
            full, _ = model(src, None, short)
            enc, state = model.encoder(src), {}
            inc = torch.cat(
                [model.decoder(short[:, :t], enc, incremental_state=state)[0] for t in (1, 2, 3)],
                1,
            )
        assert torch.allclose(inc, full, atol=1e-5, rtol=1e-5) == same, conv_type


def test_encoder_and_decoder_built_alone_take_fairseqs_derived_settings():
    """Built from a config that was not resolved, they fill in what fairseq derives (one home:
    LightConvConfig.resolved): weight dropout from attention dropout, the decoder's sizes."""
    from convseq.models.lightconv import LightConvDecoder, LightConvEncoder

    cfg = tiny(attention_dropout=0.3)
    assert cfg.weight_dropout is None and cfg.decoder_embed_dim is None  # left to be derived
    embed = torch.nn.Embedding(11, cfg.encoder_embed_dim, padding_idx=1)
    encoder, decoder = LightConvEncoder(cfg, embed), LightConvDecoder(cfg, embed)
    assert {layer.conv.weight_dropout for layer in [*encoder.layers, *decoder.layers]} == {0.3}
    assert decoder.layers[0].linear2.out_features == cfg.encoder_embed_dim
    assert decoder.project_out_dim is None  # the output width is the embedding width
