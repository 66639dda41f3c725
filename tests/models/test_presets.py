"""The presets in conf/model: fairseq's numbers, parameter counts, shapes and state-dict names."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from convseq.models.config import FConvConfig
from convseq.models.fconv import FConvModel
from convseq.models.spec import parse_layers

CONF = Path(__file__).resolve().parents[2] / "conf" / "model"
V_SRC, V_TGT = 1000, 1200  # small vocabularies keep the literals checkable by hand

# fairseq/models/fconv.py:699-756 (reference section 1.1); dropout and max positions are the
# base / task defaults since no architecture sets them
FAIRSEQ = {
    "fconv": (512, "[(512, 3)] * 20", 512, "[(512, 3)] * 20", 256),
    "fconv_iwslt_de_en": (256, "[(256, 3)] * 4", 256, "[(256, 3)] * 3", 256),
    "fconv_wmt_en_ro": (512, "[(512, 3)] * 20", 512, "[(512, 3)] * 20", 512),
    "fconv_wmt_en_de": (
        768,
        "[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2",
        768,
        "[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2",
        512,
    ),
    "fconv_wmt_en_fr": (
        768,
        "[(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3 + [(2048, 1)] + [(4096, 1)]",
        768,
        "[(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3 + [(2048, 1)] + [(4096, 1)]",
        512,
    ),
}

# Parameter counts for V_src = 1000, V_tgt = 1200, 1024-row position tables, from fairseq's
# layer formulas: weight-normed Linear(in, out) = out*in + out (g) + out (bias) = out*(in+2);
# conv to 2C channels = k*in*2C + 2C (g) + 2C (bias) = 2C*(k*in+2); embeddings V*E.
PARAMS = {
    # enc: 1000*512 + 1024*512 + fc1 512*514 + 20 * 1024*(3*512+2) + fc2 512*514 = 33060864
    # dec: 1200*512 + 1024*512 + fc1 512*514 + 20 * 1024*1538 + attn 20 * 2 * 512*514
    #      + fc2 256*514 + fc3 1200*258 = 43868000
    "fconv": 76928864,
    # enc: 1000*256 + 1024*256 + 256*258 + 4 * 512*(3*256+2) + 256*258 = 2227200
    # dec: 1200*256 + 1024*256 + 256*258 + 3 * 512*770 + 3 * 2 * 256*258 + 256*258
    #      + 1200*258 = 2590048
    "fconv_iwslt_de_en": 4817248,
    # fconv with fc2 512*514 (+131584) and fc3 1200*514 (+307200)
    "fconv_wmt_en_ro": 77367648,
    # enc: 768000 + 786432 + fc1 512*770 + 9 * 1024*1538 + 2048*1538 + proj9 1024*514
    #      + 3 * 2048*(3*1024+2) + 4096*(1024+2) + proj13 2048*1026 + 4096*2050 + fc2 768*2050
    #      = 54960640
    # dec: 921600 + 786432 + 394240 + the same convs/projections (51437568)
    #      + attn 9 * (768*514 + 512*770) + 4 * (768*1026 + 1024*770) + 2 * (768*2050 + 2048*770)
    #      + fc2 512*2050 + fc3 1200*514 = 74915680
    "fconv_wmt_en_de": 129876320,
    # enc: 768000 + 786432 + 394240 + 6 * 1024*1538 + 1536*1538 + proj 768*514
    #      + 3 * 1536*(3*768+2) + 2048*2306 + proj 1024*770 + 2 * 2048*3074
    #      + 4096*1026 + proj 2048*1026 + 8192*2050 + proj 4096*2050 + fc2 768*4098 = 77524992
    # dec: 921600 + 786432 + 394240 + 72429056 (convs, projections)
    #      + attn 6 * 788992 + 4 * 2 * 768*770 + 3 * 1576448 + 3151360 + (768*4098 + 4096*770)
    #      + fc2 512*4098 + fc3 1200*514 = 100893024
    "fconv_wmt_en_fr": 178418016,
    # enc: 1000*128 + 1024*128 + 128*130 + 4 * 256*(5*128+2) + 128*130 = 949760
    # dec: 1200*128 + 1024*128 + 128*130 + 3 * 256*(3*128+2) + 3 * 2 * 128*130 + 128*130
    #      + 1200*130 = 870240
    "fconv_toy": 1820000,
    # enc: 1000*128 + 1024*128 + 128*130 + 3 * 256*(3*128+2) + 128*130 = 588800
    # dec: 1200*128 + 1024*128 + 128*130 + 2 * 256*(3*128+2) + 2 * 2 * 128*130 + 128*130
    #      + 1200*130 = 738144
    "fconv_compare": 1326944,
}


def _load(name: str) -> FConvConfig:
    preset = OmegaConf.load(CONF / f"{name}.yaml")
    assert list(preset.pop("defaults")) == ["schema/fconv@_here_", "_self_"]
    node = OmegaConf.merge(OmegaConf.structured(FConvConfig), preset)
    return OmegaConf.to_object(node)


def test_every_preset_file_is_listed():
    assert sorted(p.stem for p in CONF.glob("fconv*.yaml")) == sorted(PARAMS)


@pytest.mark.parametrize("name", sorted(FAIRSEQ))
def test_preset_equals_fairseq(name):
    cfg = _load(name)
    enc_dim, enc_layers, dec_dim, dec_layers, out_dim = FAIRSEQ[name]
    assert cfg.arch == name
    assert cfg.encoder_embed_dim == enc_dim and cfg.decoder_embed_dim == dec_dim
    assert parse_layers(cfg.encoder_layers) == parse_layers(enc_layers)
    assert parse_layers(cfg.decoder_layers) == parse_layers(dec_layers)
    assert cfg.decoder_out_embed_dim == out_dim
    assert cfg.decoder_attention is True
    assert cfg.share_input_output_embed is False
    assert cfg.dropout == 0.1
    assert cfg.max_source_positions == 1024 and cfg.max_target_positions == 1024


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_preset_parameter_count_and_shapes(name):
    # the meta device builds shapes only: the 178M-parameter presets cost no memory or time
    with torch.device("meta"):
        model = FConvModel.build(_load(name), V_SRC, V_TGT).eval()
        src = torch.ones(2, 5, dtype=torch.long)
        prev = torch.ones(2, 4, dtype=torch.long)
        logits, attn = model(src, torch.tensor([5, 5]), prev)
    assert sum(p.numel() for p in model.parameters()) == PARAMS[name]
    assert logits.shape == (2, 4, V_TGT)
    assert attn.shape == (2, 4, 5)
    assert model.max_positions() == (1022, 1022)


def test_small_presets_run_on_cpu():
    for name in ("fconv_toy", "fconv_iwslt_de_en"):
        model = FConvModel.build(_load(name), V_SRC, V_TGT).eval()
        src = torch.tensor([[1, 1, 5, 6, 2], [7, 8, 9, 10, 2]])
        prev = torch.tensor([[2, 5, 6, 7], [2, 8, 9, 1]])
        logits, attn = model(src, torch.tensor([3, 5]), prev)
        assert logits.shape == (2, 4, V_TGT) and torch.isfinite(logits).all()
        torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4))


def _iwslt_state_dict_spec() -> list[tuple[str, tuple[int, ...]]]:
    """Reference section 1.7 for fconv_iwslt_de_en (E = C = D = 256, no projections)."""

    def wn(name, out, inp):
        return [
            (f"{name}.bias", (out,)),
            (f"{name}.weight_g", (out, 1)),
            (f"{name}.weight_v", (out, inp)),
        ]

    def conv(name, k, inp, out2):
        return [
            (f"{name}.bias", (out2,)),
            (f"{name}.weight_g", (1, 1, out2)),
            (f"{name}.weight_v", (k, inp, out2)),
        ]

    keys = [("encoder.embed_tokens.weight", (V_SRC, 256))]
    keys += [("encoder.embed_positions.weight", (1024, 256))]
    keys += wn("encoder.fc1", 256, 256)
    for i in range(4):
        keys += conv(f"encoder.convolutions.{i}", 3, 256, 512)
    keys += wn("encoder.fc2", 256, 256)
    keys += [("decoder.version", (1,))]
    keys += [("decoder.embed_tokens.weight", (V_TGT, 256))]
    keys += [("decoder.embed_positions.weight", (1024, 256))]
    keys += wn("decoder.fc1", 256, 256)
    for i in range(3):
        keys += conv(f"decoder.convolutions.{i}", 3, 256, 512)
    for i in range(3):
        keys += wn(f"decoder.attention.{i}.in_projection", 256, 256)
        keys += wn(f"decoder.attention.{i}.out_projection", 256, 256)
    keys += wn("decoder.fc2", 256, 256)
    keys += wn("decoder.fc3", V_TGT, 256)
    return keys


def test_iwslt_state_dict_keys_and_shapes_are_fairseqs():
    model = FConvModel.build(_load("fconv_iwslt_de_en"), V_SRC, V_TGT)
    got = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    assert got == _iwslt_state_dict_spec()  # names, shapes and registration order
    assert model.state_dict()["decoder.version"].item() == 2.0


def test_a_fairseq_named_state_dict_loads_strictly_with_fairseq_semantics():
    torch.manual_seed(0)
    state = {k: torch.randn(shape) for k, shape in _iwslt_state_dict_spec()}
    state["decoder.version"] = torch.tensor([2.0])
    model = FConvModel.build(_load("fconv_iwslt_de_en"), V_SRC, V_TGT)
    model.load_state_dict(state, strict=True)
    # effective weights: Linear g (out, 1) over rows; conv g (1, 1, 2C) over (k, in)
    g, v = state["decoder.fc1.weight_g"], state["decoder.fc1.weight_v"]
    torch.testing.assert_close(model.decoder.fc1.weight, g * v / v.norm(dim=1, keepdim=True))
    g, v = state["encoder.convolutions.2.weight_g"], state["encoder.convolutions.2.weight_v"]
    norm = v.pow(2).sum(dim=(0, 1), keepdim=True).sqrt()
    torch.testing.assert_close(model.encoder.convolutions[2].weight, g * v / norm)
    assert torch.equal(
        model.decoder.embed_positions.weight, state["decoder.embed_positions.weight"]
    )
    with pytest.raises(RuntimeError, match="Unexpected key"):
        model.load_state_dict({**state, "decoder.fc4.bias": torch.zeros(1)}, strict=True)


def test_shared_output_embedding_follows_fairseq():
    cfg = {**vars(_load("fconv_iwslt_de_en")), "share_input_output_embed": True}
    model = FConvModel.build(cfg, V_SRC, V_TGT)
    assert model.decoder.fc3.weight is model.decoder.embed_tokens.weight
    fc3 = {k: tuple(v.shape) for k, v in model.state_dict().items() if k.startswith("decoder.fc3")}
    assert fc3 == {"decoder.fc3.weight": (V_TGT, 256), "decoder.fc3.bias": (V_TGT,)}
    # 4817248 - (1200*258 unshared fc3) + 1200 (plain bias; the weight is the embedding)
    assert sum(p.numel() for p in model.parameters()) == 4817248 - 309600 + 1200
    with pytest.raises(ValueError, match="decoder_out_embed_dim == decoder_embed_dim"):
        FConvModel.build({**cfg, "decoder_out_embed_dim": 128}, V_SRC, V_TGT)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PARAMS))
def test_every_preset_runs_on_cpu(name):
    model = FConvModel.build(_load(name), V_SRC, V_TGT).eval()
    src = torch.tensor([[1, 1, 5, 6, 2], [7, 8, 9, 10, 2]])
    logits, _ = model(src, torch.tensor([3, 5]), torch.tensor([[2, 5, 6], [2, 8, 9]]))
    assert logits.shape == (2, 3, V_TGT) and torch.isfinite(logits).all()
    assert not math.isnan(logits.std().item())
