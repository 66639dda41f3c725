"""Model families: `model=<preset>` composes the preset's family's typed config (fairseq's
LightConv presets with fairseq's values), Python callers' dicts and checkpoints are typed by the
family they name, a key or value the family refuses is one clear line, and training and loading
build the family the config names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from convseq.cli.command_line import main_guard
from convseq.cli.composition import ConfigValueError, check_composition
from convseq.common.config import plain
from convseq.errors import ConvseqError
from convseq.inference.loading import model_from_checkpoint
from convseq.models.config import FConvConfig, ModelConfigError
from convseq.models.family import FAMILIES, build_model, family_of, model_config, preset_config
from convseq.models.fconv import FConvModel
from convseq.models.lightconv import LightConvModel
from convseq.models.lightconv_config import LightConvConfig
from convseq.tasks.config import as_config
from convseq.training.module import ConvSeqModule
from tests.conftest import CONF_DIR, compose_config

BASE_KERNELS = ([3, 7, 15, 31, 31, 31, 31], [3, 7, 15, 31, 31, 31])  # fairseq's base_architecture
# fairseq 0.12 fairseq/models/lightconv.py, each @register_model_architecture function's values
# (with base_architecture's for what it leaves): embed, ffn, heads, glu, dropout, attention
# dropout, weight dropout, input dropout
FAIRSEQ_PRESETS = {
    "lightconv_iwslt_de_en": (512, 1024, 4, False, 0.1, 0.1, 0.1, 0.0),
    "lightconv_wmt_en_de": (512, 2048, 8, True, 0.1, 0.0, 0.0, 0.1),
    "lightconv_wmt_en_de_big": (1024, 4096, 16, True, 0.3, 0.1, 0.1, 0.1),
    "lightconv_wmt_en_fr_big": (1024, 4096, 16, True, 0.1, 0.1, 0.1, 0.1),
    "lightconv_wmt_zh_en_big": (1024, 4096, 16, True, 0.2, 0.2, 0.2, 0.1),
}
TINY = dict(  # a LightConv small enough to build and run in milliseconds
    family="lightconv",
    encoder_embed_dim=16,
    encoder_ffn_embed_dim=32,
    encoder_layers=2,
    encoder_attention_heads=2,
    encoder_kernel_size_list=[3, 5],
    decoder_layers=2,
    decoder_attention_heads=2,
    decoder_kernel_size_list=[3, 5],
)


def _composed_model(args: list[str]):
    """The typed model config of `python run.py *args` (as dispatch hands it to training)."""
    return as_config(compose_config(args, output_dir="/nowhere")).model


def _typed_dict(model: dict):
    """The typed model config of a Python caller's plain train config holding `model`."""
    config = OmegaConf.to_container(compose_config([], output_dir="/nowhere"), resolve=True)
    return as_config({**config, "model": model}).model


def test_every_lightconv_preset_file_is_a_fairseq_preset_or_ours():
    names = sorted(p.stem for p in (CONF_DIR / "model").glob("lightconv*.yaml"))
    assert names == sorted([*FAIRSEQ_PRESETS, "lightconv_toy", "lightconv_multi30k"])


@pytest.mark.parametrize("name", sorted(FAIRSEQ_PRESETS))
def test_a_composed_lightconv_preset_has_fairseqs_values(name):
    cfg = _composed_model([f"model={name}"])
    embed, ffn, heads, glu, dropout, attn_dropout, weight_dropout, input_dropout = FAIRSEQ_PRESETS[
        name
    ]
    assert type(cfg) is LightConvConfig and cfg.arch == name and cfg.family == "lightconv"
    r = cfg.resolved()
    assert (r.encoder_embed_dim, r.decoder_embed_dim) == (embed, embed)
    assert (r.encoder_conv_dim, r.decoder_conv_dim, r.decoder_output_dim) == (embed,) * 3
    assert (r.encoder_ffn_embed_dim, r.decoder_ffn_embed_dim) == (ffn, ffn)
    assert (r.encoder_attention_heads, r.decoder_attention_heads) == (heads, heads)
    assert (r.encoder_layers, r.decoder_layers) == (7, 6)
    assert (list(r.encoder_kernel_size_list), list(r.decoder_kernel_size_list)) == BASE_KERNELS
    assert (r.encoder_glu, r.decoder_glu) == (glu, glu)
    assert (r.dropout, r.attention_dropout, r.weight_dropout) == (
        dropout,
        attn_dropout,
        weight_dropout,
    )
    assert (r.input_dropout, r.relu_dropout) == (input_dropout, 0.0)
    assert (r.encoder_conv_type, r.decoder_conv_type) == ("dynamic", "dynamic")
    assert r.weight_softmax and not (r.encoder_normalize_before or r.decoder_normalize_before)
    assert not (r.encoder_learned_pos or r.share_all_embeddings or r.no_token_positional_embeddings)
    assert (r.max_source_positions, r.max_target_positions) == (1024, 1024)


def test_fconv_presets_still_compose_to_fconvs_config():
    cfg = _composed_model(["model=fconv_iwslt_de_en"])
    assert type(cfg) is FConvConfig and cfg.family == "fconv" and cfg.arch == "fconv_iwslt_de_en"


def test_a_lightconv_key_set_on_the_command_line_reaches_the_typed_config():
    args = [
        "model=lightconv_toy",
        "model.encoder_conv_type=lightweight",
        "model.weight_dropout=0.2",
    ]
    cfg = _composed_model(args)
    assert cfg.encoder_conv_type == "lightweight" and cfg.decoder_conv_type == "dynamic"
    assert cfg.weight_dropout == 0.2


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main_guard(argv, CONF_DIR)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    return err.removeprefix("convseq: error: ").strip()


@pytest.mark.parametrize("plus", ["", "+"])
def test_another_familys_key_is_refused_naming_the_family_it_belongs_to(plus, capsys):
    msg = _refused(["model=fconv_toy", f"{plus}model.encoder_conv_type=dynamic"], capsys)
    assert msg.startswith("unknown config key model.encoder_conv_type for a model of the fconv"), (
        msg
    )
    assert "it is a key of the lightconv family's models" in msg
    msg = _refused(["model=lightconv_toy", f"{plus}model.decoder_out_embed_dim=64"], capsys)
    assert "model.decoder_out_embed_dim for a model of the lightconv family" in msg
    assert "key of the fconv family's models" in msg


def test_a_misspelt_lightconv_key_names_the_closest_lightconv_keys(capsys):
    msg = _refused(["model=lightconv_toy", "+model.encoder_conv_typ=dynamic"], capsys)
    assert "unknown config key model.encoder_conv_typ (did you mean model.encoder_conv_type" in msg


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["model.encoder_conv_type=dynamc"],
            "model.encoder_conv_type='dynamc': choose lightweight",
        ),
        (["model.encoder_layers=4"], "model.encoder_kernel_size_list has 3 sizes for model.enc"),
        (["model.encoder_layers=x"], "model.encoder_layers takes an integer, not the string 'x'"),
        (["model.family=fconv"], "model.family comes with the preset, not on its own"),
    ],
)
def test_a_value_the_family_refuses_is_one_line_before_anything_runs(args, expected, capsys):
    assert expected in _refused(["model=lightconv_toy", *args], capsys)


def test_the_check_that_composes_refuses_a_bad_value_too():
    with pytest.raises(ConfigValueError, match="decoder_conv_type='light': choose lightweight"):
        check_composition(["model=lightconv_toy", "model.decoder_conv_type=light"], CONF_DIR)


def test_a_python_callers_dict_is_typed_by_the_family_it_names():
    cfg = _typed_dict(dict(TINY))
    assert type(cfg) is LightConvConfig and cfg.encoder_kernel_size_list == [3, 5]
    assert type(_typed_dict({"dropout": 0.3})) is FConvConfig
    with pytest.raises(ConvseqError, match=r"config\.model\.decoder_out_embed_dim.*encoder_glu"):
        _typed_dict({**TINY, "decoder_out_embed_dim": 8})
    with pytest.raises(ModelConfigError, match="'lightconvv' \\(did you mean lightconv\\?\\)"):
        _typed_dict({"family": "lightconvv"})


def test_a_dataclass_of_another_family_than_it_names_is_refused():
    bad = FConvConfig()
    bad.family = "lightconv"
    with pytest.raises(ModelConfigError, match="FConvConfig names family 'lightconv'"):
        model_config(bad)


def test_build_model_builds_the_family_the_config_names():
    assert set(FAMILIES) == {"fconv", "lightconv"}
    light = build_model(dict(TINY), 20, 24, 1)
    assert type(light) is LightConvModel and light.decoder.output_projection.out_features == 24
    fconv = build_model({"encoder_layers": "[(16, 3)]", "decoder_layers": "[(16, 3)]"}, 20, 24, 1)
    assert type(fconv) is FConvModel  # no `family` key: an older checkpoint's, fconv
    assert family_of({}).name == "fconv" and family_of(LightConvConfig()).name == "lightconv"


def _vocab(n: int) -> list[str]:
    return ["<s>", "<pad>", "</s>", "<unk>", *(f"w{i}" for i in range(n))]


def test_a_lightconv_modules_checkpoint_holds_plain_values_and_loads_its_family(tmp_path: Path):
    torch.manual_seed(0)
    module = ConvSeqModule(model=model_config(dict(TINY)), src_vocab=_vocab(9), tgt_vocab=_vocab(7))
    assert isinstance(module.model, LightConvModel)
    hp = dict(module.hparams)
    assert hp["model"] == plain(model_config(dict(TINY))) and hp["model"]["family"] == "lightconv"
    ckpt = {"hyper_parameters": hp, "state_dict": module.state_dict()}
    path = tmp_path / "m.ckpt"
    torch.save(ckpt, path)
    loaded = model_from_checkpoint(torch.load(path, weights_only=True), path).model
    assert type(loaded) is LightConvModel
    src = torch.tensor([[1, 5, 6, 7, 2], [8, 9, 10, 11, 2]])  # (2, 5) left-padded source
    prev = torch.tensor([[2, 5, 6], [2, 7, 1]])  # (2, 3) EOS-first decoder input
    module.model.eval()
    with torch.no_grad():
        expected = module.model(src, None, prev)[0]
        assert torch.equal(loaded(src, None, prev)[0], expected)


def test_a_checkpoint_whose_weights_are_another_familys_is_refused(tmp_path: Path):
    light = ConvSeqModule(model=model_config(dict(TINY)), src_vocab=_vocab(9), tgt_vocab=_vocab(7))
    hp = {**dict(light.hparams), "model": {"encoder_layers": "[(16, 3)]"}}  # says fconv
    ckpt = {"hyper_parameters": hp, "state_dict": light.state_dict()}
    with pytest.raises(ConvseqError, match="not a convseq model checkpoint"):
        model_from_checkpoint(ckpt, tmp_path / "x.ckpt")


@pytest.mark.parametrize("name", ["fconv_toy", "lightconv_iwslt_de_en"])
def test_a_preset_file_read_without_hydra_is_the_composed_preset(name):
    assert preset_config(CONF_DIR / "model" / f"{name}.yaml") == _composed_model([f"model={name}"])


def test_every_preset_file_names_its_family_and_reads_as_that_familys_config():
    for path in sorted((CONF_DIR / "model").glob("*.yaml")):
        cfg = preset_config(path)
        assert cfg.arch == path.stem and type(cfg) is FAMILIES[cfg.family].config, path
