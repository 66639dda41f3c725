"""fairseq LightConv / DynamicConv checkpoints both ways: convseq's model written with
save_fairseq reads back identical; files laid out as fairseq writes them (tests/
fairseq_ckpt_factory.py) load strictly; fairseq's architecture presets give fairseq's values."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from convseq.checkpoints.fairseq import load_fairseq, save_fairseq
from convseq.checkpoints.fairseq_lightconv import lightconv_config
from convseq.checkpoints.safe_load import read_checkpoint
from convseq.data.dictionary import Dictionary
from convseq.errors import CheckpointError
from convseq.models.lightconv import LightConvModel
from convseq.models.lightconv_config import LightConvConfig
from tests.fairseq_ckpt_factory import (
    fairseq_container,
    fairseq_namespace,
    lightconv_keys_and_shapes,
    lightconv_state_dict,
    write_checkpoint,
    write_dict,
)

TINY = dict(
    arch="lightconv_tiny",
    encoder_embed_dim=8,
    encoder_ffn_embed_dim=12,
    encoder_layers=2,
    encoder_attention_heads=2,
    encoder_kernel_size_list=(3, 5),
    decoder_layers=2,
    decoder_attention_heads=2,
    decoder_kernel_size_list=(3, 5),
    max_source_positions=20,
    max_target_positions=24,
)
SRC = torch.tensor([[1, 1, 5, 6, 2], [7, 8, 9, 5, 2]])  # the first row left-padded
LENGTHS = torch.tensor([3, 5])
PREV = torch.tensor([[2, 4, 9, 11], [2, 12, 5, 6]])


def _vocab(n: int, tag: str) -> Dictionary:
    return Dictionary.build([" ".join(f"{tag}{i}" for i in range(n))])


def _log_probs(model) -> torch.Tensor:
    with torch.no_grad():
        return model.get_normalized_probs(model.eval()(SRC, LENGTHS, PREV), log_probs=True)


@pytest.mark.parametrize(
    "style, conv, extra",
    [
        ("args", ("dynamic", "lightweight"), {}),
        ("cfg", ("lightweight", "dynamic"), {"encoder_learned_pos": True}),
        ("args", ("dynamic", "dynamic"), {"share_all_embeddings": True, "encoder_glu": False}),
    ],
)
def test_save_then_load_gives_identical_weights_and_log_probs(tmp_path, style, conv, extra):
    torch.manual_seed(0)
    cfg = LightConvConfig(
        **TINY, encoder_conv_type=conv[0], decoder_conv_type=conv[1], dropout=0.3, **extra
    )
    src_dict = _vocab(10, "a")
    tgt_dict = src_dict if cfg.share_all_embeddings else _vocab(17, "b")
    model = LightConvModel.build(cfg, len(src_dict), len(tgt_dict), src_dict.pad()).eval()
    path = save_fairseq(model, tmp_path / "m.pt", src_dict, tgt_dict, "xx", "yy", style)
    loaded, src2, tgt2 = load_fairseq(path)
    assert isinstance(loaded, LightConvModel)
    assert src2 == src_dict and tgt2 == tgt_dict
    before, after = model.state_dict(), loaded.state_dict()
    assert list(before) == list(after)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(_log_probs(model), _log_probs(loaded))
    # every hyperparameter; a convseq preset's name reads back as fairseq's base arch
    assert loaded.cfg.arch == "lightconv"
    assert dataclasses.replace(loaded.cfg, arch=model.cfg.arch) == model.cfg


def test_written_arguments_are_fairseqs_explicitly(tmp_path):
    src_dict, tgt_dict = _vocab(10, "a"), _vocab(17, "b")
    model = LightConvModel.build(LightConvConfig(**TINY), len(src_dict), len(tgt_dict), 1)
    path = save_fairseq(model, tmp_path / "m.pt", src_dict, tgt_dict, "de", "en")
    state = read_checkpoint(path)
    args = state["args"]
    # a convseq preset fairseq does not register is written as fairseq's base arch
    assert (args.arch, args.task, args.source_lang, args.left_pad_source) == (
        "lightconv",
        "translation",
        "de",
        "True",
    )
    # the values fairseq would otherwise derive or default are all there
    assert (args.decoder_embed_dim, args.decoder_conv_dim, args.decoder_ffn_embed_dim) == (8, 8, 12)
    assert args.encoder_kernel_size_list == [3, 5] and args.decoder_kernel_size_list == [3, 5]
    assert (args.weight_dropout, args.input_dropout, args.encoder_glu) == (0.0, 0.1, True)
    assert (args.max_source_positions, args.max_target_positions) == (20, 24)
    assert not hasattr(args, "family")
    assert "encoder.embed_positions._float_tensor" not in state["model"]  # as fairseq 0.12


# -- files laid out as fairseq writes them ---------------------------------------------------------

SHAPES = dict(
    src_vocab=16,
    tgt_vocab=24,
    embed_dim=8,
    ffn_dim=12,
    heads=2,
    encoder_kernels=[3, 7],
    decoder_kernels=[3, 3],
)
ARGS = dict(
    arch="lightconv",
    encoder_embed_dim=8,
    encoder_ffn_embed_dim=12,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_kernel_size_list=[3, 7],
    decoder_kernel_size_list=[3],  # one size: fairseq repeats it per layer
    encoder_conv_type="dynamic",
    decoder_conv_type="lightweight",
    weight_softmax=True,
)


def _fairseq_file(tmp_path, shapes=None, form="args", **args):
    keys = lightconv_keys_and_shapes(**{**SHAPES, **(shapes or {})})
    sd = lightconv_state_dict(keys, seed=4)
    namespace = fairseq_namespace({**ARGS, **args})
    if form == "args":
        path = write_checkpoint(tmp_path / "model.pt", sd, args=namespace)
    else:
        path = write_checkpoint(tmp_path / "model.pt", sd, cfg=fairseq_container(namespace))
    write_dict(tmp_path / "dict.de.txt", 16)
    write_dict(tmp_path / "dict.en.txt", 24)
    return path, sd


@pytest.mark.parametrize("form", ["args", "cfg"])
@pytest.mark.parametrize("old_buffers", [False, True])
def test_fairseq_file_loads_strictly(tmp_path, form, old_buffers):
    """With or without the _float_tensor buffers of releases before 0.12."""
    path, sd = _fairseq_file(
        tmp_path, dict(decoder_conv_type="lightweight", float_tensor=old_buffers), form
    )
    assert ("encoder.embed_positions._float_tensor" in sd) is old_buffers
    model, src_dict, tgt_dict = load_fairseq(path)
    assert (len(src_dict), len(tgt_dict)) == (16, 24)
    assert model.cfg.decoder_kernel_size_list == (3, 3)
    assert model.cfg.decoder_conv_type == "lightweight"
    own = model.state_dict()
    assert set(own) == {k for k in sd if not k.endswith("_float_tensor")}
    # fairseq's dynamic convolutions hold a conv_bias they never use: convseq writes zeros there
    unused = {k for k in own if k.endswith("conv.conv_bias")}
    assert len(unused) == 2 and all(not own[k].any() for k in unused)
    assert all(torch.equal(own[k], sd[k]) for k in own if k not in unused)
    assert _log_probs(model).shape == (2, 4, 24)


def test_learned_positions_and_the_old_output_matrix_name(tmp_path):
    shapes = dict(
        learned_pos=True, max_positions=40, embed_out=True, decoder_conv_type="lightweight"
    )
    path, sd = _fairseq_file(tmp_path, shapes, encoder_learned_pos=True, decoder_learned_pos=True)
    model, _, _ = load_fairseq(path)
    # the tables have 40 + pad + 1 rows; the checkpoint's 1024 give way to them
    assert (model.cfg.max_source_positions, model.cfg.max_target_positions) == (40, 40)
    own = model.state_dict()
    assert torch.equal(own["decoder.output_projection.weight"], sd["decoder.embed_out"])
    assert torch.equal(own["encoder.embed_positions.weight"], sd["encoder.embed_positions.weight"])


def test_a_wrong_shape_names_the_key(tmp_path):
    path, _ = _fairseq_file(tmp_path, dict(decoder_conv_type="lightweight"), decoder_glu=False)
    with pytest.raises(
        CheckpointError, match=r"shape mismatch.*decoder\.layers\.0\.linear1\.weight"
    ):
        load_fairseq(path)


def test_a_missing_key_is_named(tmp_path):
    # the file says dynamic for the decoder; its layers hold lightweight kernels
    path, _ = _fairseq_file(
        tmp_path, dict(decoder_conv_type="lightweight"), decoder_conv_type="dynamic"
    )
    with pytest.raises(CheckpointError) as e:
        load_fairseq(path)
    assert "missing ['decoder.layers.0.conv.weight_linear.weight'" in str(e.value)
    assert "unexpected ['decoder.layers.0.conv.weight'" in str(e.value)


def test_an_unknown_architecture_lists_those_convseq_reads(tmp_path):
    path, _ = _fairseq_file(tmp_path, dict(decoder_conv_type="lightweight"), arch="lightconv_lm")
    with pytest.raises(
        CheckpointError, match="'lightconv_lm' is not one of .*lightconv_iwslt_de_en"
    ):
        load_fairseq(path)


# -- fairseq's architecture presets (values from fairseq/models/lightconv.py, written out) --------

BASE = dict(
    encoder_embed_dim=512,
    encoder_ffn_embed_dim=2048,
    encoder_attention_heads=8,
    decoder_embed_dim=512,
    decoder_ffn_embed_dim=2048,
    decoder_attention_heads=8,
    dropout=0.1,
    attention_dropout=0.0,
    weight_dropout=0.0,
    input_dropout=0.1,
    encoder_glu=True,
    decoder_glu=True,
)
BIG = dict(
    BASE,
    encoder_embed_dim=1024,
    encoder_ffn_embed_dim=4096,
    encoder_attention_heads=16,
    decoder_embed_dim=1024,
    decoder_ffn_embed_dim=4096,
    decoder_attention_heads=16,
    dropout=0.3,
    attention_dropout=0.1,
    weight_dropout=0.1,
)
FAIRSEQ_PRESETS = {
    "lightconv": BASE,
    "lightconv_iwslt_de_en": dict(
        BASE,
        encoder_ffn_embed_dim=1024,
        encoder_attention_heads=4,
        decoder_ffn_embed_dim=1024,
        decoder_attention_heads=4,
        attention_dropout=0.1,
        weight_dropout=0.1,
        input_dropout=0.0,
        encoder_glu=False,
        decoder_glu=False,
    ),
    "lightconv_wmt_en_de": BASE,
    "lightconv_wmt_en_de_big": BIG,
    "lightconv_wmt_en_fr_big": dict(BIG, dropout=0.1),
    "lightconv_wmt_zh_en_big": dict(BIG, dropout=0.2, attention_dropout=0.2, weight_dropout=0.2),
}


@pytest.mark.parametrize("arch", sorted(FAIRSEQ_PRESETS))
@pytest.mark.parametrize("form", ["args", "cfg"])
def test_fairseq_presets_give_fairseqs_values(arch, form):
    model = argparse.Namespace(arch=arch) if form == "args" else argparse.Namespace(_name=arch)
    state = {"args": model} if form == "args" else {"cfg": {"model": model, "task": {}}}
    cfg = lightconv_config(state)
    got = {k: getattr(cfg, k) for k in FAIRSEQ_PRESETS[arch]}
    assert got == FAIRSEQ_PRESETS[arch]
    assert (cfg.arch, cfg.encoder_layers, cfg.decoder_layers) == (arch, 7, 6)
    assert cfg.encoder_kernel_size_list == (3, 7, 15, 31, 31, 31, 31)
    assert cfg.decoder_kernel_size_list == (3, 7, 15, 31, 31, 31)
    assert (cfg.encoder_conv_type, cfg.decoder_conv_type) == ("dynamic", "dynamic")
    assert cfg.encoder_conv_dim == cfg.decoder_conv_dim == cfg.encoder_embed_dim
    assert (cfg.max_source_positions, cfg.max_target_positions) == (1024, 1024)


def test_given_arguments_win_over_the_preset_and_derived_values_follow_them():
    args = argparse.Namespace(
        arch="lightconv_iwslt_de_en",
        encoder_glu="True",  # as fairseq's eval_bool parser may leave it
        encoder_embed_dim=256,
        decoder_embed_dim=None,  # None: left to the preset
        attention_dropout=0.3,
        decoder_kernel_size_list="[5]",
        decoder_layers=3,
        max_source_positions=300,
    )
    cfg = lightconv_config({"args": args, "cfg": None})
    assert (cfg.encoder_glu, cfg.decoder_glu) == (True, False)
    assert (cfg.encoder_embed_dim, cfg.encoder_conv_dim, cfg.decoder_embed_dim) == (256, 256, 512)
    assert (cfg.attention_dropout, cfg.weight_dropout) == (0.3, 0.1)  # the preset sets weight's
    assert cfg.decoder_kernel_size_list == (5, 5, 5)
    assert cfg.max_source_positions == 300
    base = lightconv_config({"args": argparse.Namespace(arch="lightconv", attention_dropout=0.3)})
    assert base.weight_dropout == 0.3  # base_architecture derives it from attention_dropout


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("encoder_glu", "maybe", "encoder_glu: expected a boolean"),
        ("encoder_kernel_size_list", "[3, x]", "encoder_kernel_size_list: expected a list"),
        ("encoder_layers", 3, "encoder_kernel_size_list has 7 sizes"),
        ("adaptive_softmax_cutoff", "1000,5000", "no adaptive softmax"),
    ],
)
def test_bad_arguments_are_named(field, value, message):
    with pytest.raises(CheckpointError, match=message):
        lightconv_config({"args": argparse.Namespace(arch="lightconv", **{field: value})})


def test_every_config_field_is_read_from_the_arguments():
    """No field of LightConvConfig is left out of the reading (a new one would be)."""
    cfg = LightConvConfig(**TINY).resolved()
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    changed = dict(values, dropout=0.25, relu_dropout=0.05, weight_softmax=False)
    changed.pop("family")
    changed["arch"] = "lightconv"
    read = lightconv_config({"args": argparse.Namespace(**changed)})
    assert (read.dropout, read.relu_dropout, read.weight_softmax) == (0.25, 0.05, False)
    assert dataclasses.replace(read, arch=cfg.arch) == dataclasses.replace(
        cfg, dropout=0.25, relu_dropout=0.05, weight_softmax=False
    )
