"""fairseq checkpoint interop: loading fairseq fconv files (args / cfg forms, 2017 layout),
exporting convseq models, and refusing files whose pickle would run code."""

from __future__ import annotations

import argparse
import builtins
import os
import pickle
import pickletools
import zipfile
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from convseq.checkpoints.fairseq import load_fairseq, save_fairseq
from convseq.checkpoints.fairseq_fconv import arch_defaults, fconv_config
from convseq.checkpoints.safe_load import ALLOWED_GLOBALS, read_checkpoint
from convseq.data.dictionary import Dictionary
from convseq.errors import CheckpointError
from convseq.models import FConvModel, parse_attention, parse_layers
from tests.fairseq_ckpt_factory import (
    fairseq_container,
    fairseq_dictconfig,
    fairseq_namespace,
    fconv_keys_and_shapes,
    fconv_state_dict,
    write_checkpoint,
    write_databin_files,
    write_dict,
)

CONF_MODEL = Path(__file__).resolve().parents[2] / "conf" / "model"
SQRT_HALF = np.sqrt(0.5)

# -- a one-layer model with hand-set weights ----------------------------------------------------
# vocab 8 on both sides, embeddings 3, one encoder layer (2 channels, kernel 1), one decoder
# layer (2 channels, kernel 2) with attention, decoder output embedding 2, 8 positions.
TINY = dict(
    src_vocab=8,
    tgt_vocab=8,
    encoder_embed_dim=3,
    encoder_layers=[(2, 1)],
    decoder_embed_dim=3,
    decoder_layers=[(2, 2)],
    decoder_out_embed_dim=2,
    attention=[True],
    max_source_positions=8,
    max_target_positions=8,
)
TINY_ARGS = {
    "arch": "fconv",
    "dropout": 0.2,
    "encoder_embed_dim": 3,
    "encoder_layers": "[(2, 1)]",
    "decoder_embed_dim": 3,
    "decoder_layers": "[(2, 2)]",
    "decoder_out_embed_dim": 2,
    "decoder_attention": "True",
    "share_input_output_embed": False,
}
SRC = [4, 5, 6, 2]  # a sentence ending in EOS, no padding
PREV = [2, 4, 7]  # decoder input: EOS first


def hand_set_weights(per_tap_decoder: bool = False) -> dict[str, np.ndarray]:
    """Every weight of the tiny model as one-decimal numbers (pad rows of embeddings zero)."""
    keys = fconv_keys_and_shapes(**TINY, decoder_version=1.0 if per_tap_decoder else 2.0)
    rng = np.random.default_rng(7)
    weights = {}
    for name, shape in keys:
        if name == "decoder.version":
            continue
        if name.endswith("weight_g"):
            value = np.round(rng.uniform(0.5, 1.5, size=shape), 1)
        else:
            value = np.round(rng.normal(0.0, 0.6, size=shape), 1)
        if "embed_" in name:
            value[1] = 0.0  # pad row
        weights[name] = value
    return weights


def _linear(w, prefix):
    """fairseq's weight-normed Linear: W = g * v / ||v|| with one norm per output row."""
    g, v, b = w[prefix + ".weight_g"], w[prefix + ".weight_v"], w[prefix + ".bias"]
    weight = g * v / np.sqrt((v**2).sum(axis=1, keepdims=True))
    return lambda x: x @ weight.T + b


def _conv_weight(w, prefix, per_tap=False):
    """A (k, in, out) time-major conv weight: one norm per output channel over (k, in), or --
    in 2017 decoder files -- one norm per kernel tap over (in, out)."""
    g, v = w[prefix + ".weight_g"], w[prefix + ".weight_v"]
    axes = (1, 2) if per_tap else (0, 1)
    return g * v / np.sqrt((v**2).sum(axis=axes, keepdims=True)), w[prefix + ".bias"]


def _glu(x):
    half = x.shape[-1] // 2
    return x[..., :half] / (1.0 + np.exp(-x[..., half:]))


def hand_logits(w, src, prev, per_tap_decoder=False):
    """fairseq's fconv forward for the tiny model, step by step in numpy (eval mode)."""
    w = {k: np.asarray(v, dtype=np.float64) for k, v in w.items()}
    # encoder: positions start at pad + 1 = 2
    s = len(src)
    emb = (
        w["encoder.embed_tokens.weight"][src]
        + w["encoder.embed_positions.weight"][np.arange(s) + 2]
    )
    x = _linear(w, "encoder.fc1")(emb)  # (S, 2)
    weight, bias = _conv_weight(w, "encoder.convolutions.0")  # kernel 1: (1, 2, 4)
    x = (_glu(x @ weight[0] + bias) + x) * SQRT_HALF
    keys = _linear(w, "encoder.fc2")(x)  # (S, 3) attention keys
    values = (keys + emb) * SQRT_HALF  # attention values
    # decoder
    t = len(prev)
    target_emb = (
        w["decoder.embed_tokens.weight"][prev]
        + w["decoder.embed_positions.weight"][np.arange(t) + 2]
    )
    x = _linear(w, "decoder.fc1")(target_emb)  # (T, 2)
    weight, bias = _conv_weight(w, "decoder.convolutions.0", per_tap_decoder)  # (2, 2, 4)
    shifted = np.vstack([np.zeros((1, x.shape[1])), x[:-1]])  # x[t-1], zero before the start
    h = _glu(shifted @ weight[0] + x @ weight[1] + bias)  # causal: taps t-1 and t
    d = (_linear(w, "decoder.attention.0.in_projection")(h) + target_emb) * SQRT_HALF
    scores = d @ keys.T
    attn = np.exp(scores - scores.max(axis=1, keepdims=True))
    attn /= attn.sum(axis=1, keepdims=True)
    context = attn @ values * (s * np.sqrt(1.0 / s))  # scaled by sqrt(source length)
    h = (_linear(w, "decoder.attention.0.out_projection")(context) + h) * SQRT_HALF
    x = (h + x) * SQRT_HALF  # residual around the layer
    return _linear(w, "decoder.fc3")(_linear(w, "decoder.fc2")(x))  # (T, 8)


def _logits(model, src=SRC, prev=PREV):
    with torch.no_grad():
        logits, _ = model(torch.tensor([src]), torch.tensor([len(src)]), torch.tensor([prev]))
    return logits[0].double().numpy()


def _dicts(folder: Path, src="de", tgt="en", src_size=8, tgt_size=8) -> None:
    write_dict(folder / f"dict.{src}.txt", src_size, prefix="s")
    write_dict(folder / f"dict.{tgt}.txt", tgt_size, prefix="t")


def _tiny_checkpoint(tmp_path: Path, form: str, per_tap: bool = False, version=2.0, **kw) -> Path:
    weights = hand_set_weights(per_tap)
    keys = fconv_keys_and_shapes(**TINY, decoder_version=version)
    sd = fconv_state_dict(keys, weights, decoder_version=version)
    args = fairseq_namespace(TINY_ARGS)
    path = tmp_path / "checkpoint_best.pt"
    if form == "args":
        write_checkpoint(path, sd, args=args, **kw)
    elif form == "dictconfig":
        write_checkpoint(path, sd, args=None, cfg=fairseq_dictconfig(args), **kw)
    else:
        write_checkpoint(path, sd, args=None, cfg=fairseq_container(args), **kw)
    _dicts(tmp_path)
    return path


def test_hand_reference_is_sensitive_to_weight_norm_layout():
    """The per-tap and per-channel readings of the same gains give different logits."""
    w = hand_set_weights()
    w_tap = dict(w, **{"decoder.convolutions.0.weight_g": np.array([[[0.7]], [[1.3]]])})
    assert not np.allclose(
        hand_logits(w, SRC, PREV), hand_logits(w_tap, SRC, PREV, True), atol=1e-3
    )


@pytest.mark.parametrize("form", ["args", "dictconfig", "container"])
def test_fairseq_checkpoint_logits_equal_hand_computation(tmp_path, form):
    path = _tiny_checkpoint(tmp_path, form, numpy_metrics=form == "container")
    model, src_dict, tgt_dict = load_fairseq(path)
    assert (len(src_dict), len(tgt_dict)) == (8, 8)
    assert src_dict[4] == "s0" and tgt_dict[4] == "t0"
    assert not model.training
    assert model.cfg.dropout == pytest.approx(0.2)
    assert model.cfg.max_source_positions == 8  # taken from the positional table's rows
    expected = hand_logits(hand_set_weights(), SRC, PREV)
    np.testing.assert_allclose(_logits(model), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("version", [None, 1.0])
def test_pre_2018_decoder_weight_norm_is_folded(tmp_path, version):
    """decoder.version missing or 1: decoder conv gains are per kernel tap, (k, 1, 1)."""
    path = _tiny_checkpoint(tmp_path, "args", per_tap=True, version=version)
    assert read_checkpoint(path)["model"]["decoder.convolutions.0.weight_g"].shape == (2, 1, 1)
    model, _, _ = load_fairseq(path)
    state = model.state_dict()
    assert state["decoder.convolutions.0.weight_g"].shape == (1, 1, 4)
    assert state["decoder.version"].item() == 2.0
    expected = hand_logits(hand_set_weights(per_tap_decoder=True), SRC, PREV, per_tap_decoder=True)
    np.testing.assert_allclose(_logits(model), expected, rtol=1e-5, atol=1e-5)


def test_half_precision_checkpoint_loads_into_fp32(tmp_path):
    """fairseq --fp16 runs save half tensors; they load into the fp32 model (2017 fold too)."""
    weights = hand_set_weights(per_tap_decoder=True)
    keys = fconv_keys_and_shapes(**TINY, decoder_version=None)
    sd = fconv_state_dict(keys, weights, decoder_version=None)
    sd = type(sd)((k, v.half()) for k, v in sd.items())
    path = write_checkpoint(tmp_path / "m.pt", sd, args=fairseq_namespace(TINY_ARGS))
    _dicts(tmp_path)
    model, _, _ = load_fairseq(path)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    half_weights = {k: v.float().numpy() for k, v in sd.items()}
    expected = hand_logits(half_weights, SRC, PREV, per_tap_decoder=True)
    np.testing.assert_allclose(_logits(model), expected, rtol=1e-4, atol=1e-4)


def test_version_2_file_with_per_tap_gains_is_refused(tmp_path):
    weights = hand_set_weights(per_tap_decoder=True)
    sd = fconv_state_dict(
        fconv_keys_and_shapes(**TINY, decoder_version=1.0), weights, decoder_version=2.0
    )
    path = write_checkpoint(tmp_path / "m.pt", sd, args=fairseq_namespace(TINY_ARGS))
    _dicts(tmp_path)
    with pytest.raises(
        CheckpointError, match=r"decoder.version is 2 but decoder.convolutions.0.weight_g"
    ):
        load_fairseq(path)


# -- arguments and fairseq's architecture defaults ---------------------------------------------


def test_missing_arguments_take_the_architecture_defaults():
    cfg = fconv_config({"args": argparse.Namespace(arch="fconv_wmt_en_de", dropout=0.2)})
    assert cfg.encoder_embed_dim == 768 and cfg.decoder_out_embed_dim == 512
    assert [c for c, _, _ in parse_layers(cfg.encoder_layers)] == [512] * 9 + [1024] * 4 + [
        2048
    ] * 2
    assert cfg.dropout == 0.2 and cfg.decoder_attention is True
    assert (cfg.max_source_positions, cfg.max_target_positions) == (1024, 1024)
    # cfg form: the model Namespace carries _name; the task supplies max positions
    state = {
        "cfg": {
            "model": argparse.Namespace(_name="fconv_iwslt_de_en"),
            "task": {"max_source_positions": 500},
        }
    }
    cfg = fconv_config(state)
    assert (cfg.arch, cfg.encoder_embed_dim, cfg.max_source_positions) == (
        "fconv_iwslt_de_en",
        256,
        500,
    )
    assert len(parse_layers(cfg.decoder_layers)) == 3
    # pre-2018 files had one --max-positions for both sides
    cfg = fconv_config({"args": argparse.Namespace(arch="fconv", max_positions=300)})
    assert (cfg.max_source_positions, cfg.max_target_positions) == (300, 300)


@pytest.mark.parametrize(
    "arch", ["fconv", "fconv_iwslt_de_en", "fconv_wmt_en_ro", "fconv_wmt_en_de", "fconv_wmt_en_fr"]
)
def test_arch_defaults_agree_with_the_conf_presets(arch):
    preset = yaml.safe_load((CONF_MODEL / f"{arch}.yaml").read_text())
    defaults = arch_defaults(arch)
    for key in (
        "encoder_embed_dim",
        "decoder_embed_dim",
        "decoder_out_embed_dim",
        "share_input_output_embed",
    ):
        assert defaults[key] == preset[key], key
    for key in ("encoder_layers", "decoder_layers"):
        assert parse_layers(defaults[key], key) == parse_layers(preset[key], key)
    n = len(parse_layers(preset["decoder_layers"]))
    assert parse_attention(defaults["decoder_attention"], n) == parse_attention(
        preset["decoder_attention"], n
    )


def test_loading_with_only_the_arch_named(tmp_path):
    """A file whose args leave the model options out builds fairseq's preset for its arch."""
    keys = fconv_keys_and_shapes(
        src_vocab=16,
        tgt_vocab=24,
        encoder_embed_dim=256,
        encoder_layers=[(256, 3)] * 4,
        decoder_embed_dim=256,
        decoder_layers=[(256, 3)] * 3,
        decoder_out_embed_dim=256,
        attention=[True] * 3,
        max_source_positions=64,
        max_target_positions=64,
    )
    sd = fconv_state_dict(keys)
    args = argparse.Namespace(arch="fconv_iwslt_de_en", source_lang="de", target_lang="en")
    path = write_checkpoint(tmp_path / "model.pt", sd, args=args)
    _dicts(tmp_path, src_size=16, tgt_size=24)
    model, _, _ = load_fairseq(path)
    assert set(model.state_dict()) == set(sd)
    logits, _ = model(torch.tensor([[5, 6, 2]]), torch.tensor([3]), torch.tensor([[2, 9]]))
    assert logits.shape == (1, 2, 24)


@pytest.mark.parametrize("preset", ["iwslt", "residuals"])
def test_model_state_dict_has_fairseqs_keys_and_shapes_in_order(preset):
    """convseq's state dict equals the list written from fairseq's layout (reference 1.7)."""
    if preset == "iwslt":
        cfg = dict(arch="fconv_iwslt_de_en", **arch_defaults("fconv_iwslt_de_en"))
        spec = dict(
            encoder_embed_dim=256,
            encoder_layers=[(256, 3)] * 4,
            decoder_embed_dim=256,
            decoder_layers=[(256, 3)] * 3,
            decoder_out_embed_dim=256,
            attention=[True] * 3,
        )
    else:
        cfg = ROUND_TRIP
        spec = dict(
            encoder_embed_dim=6,
            encoder_layers=ROUND_TRIP["encoder_layers"],
            decoder_embed_dim=6,
            decoder_layers=ROUND_TRIP["decoder_layers"],
            decoder_out_embed_dim=5,
            attention=[True, False, True],
            max_source_positions=32,
            max_target_positions=40,
        )
    model = FConvModel.build(cfg, 16, 24)
    expected = fconv_keys_and_shapes(src_vocab=16, tgt_vocab=24, **spec)
    assert [(k, tuple(v.shape)) for k, v in model.state_dict().items()] == expected


def test_unknown_architecture_is_refused(tmp_path):
    sd = fconv_state_dict(fconv_keys_and_shapes(**TINY))
    path = write_checkpoint(
        tmp_path / "m.pt",
        sd,
        args=argparse.Namespace(arch="fconv_lm", source_lang="de", target_lang="en"),
    )
    _dicts(tmp_path)
    with pytest.raises(
        CheckpointError, match="'fconv_lm' is not one of fairseq's translation architectures"
    ):
        load_fairseq(path)


def test_state_that_does_not_fit_the_arguments_names_the_keys(tmp_path):
    sd = fconv_state_dict(fconv_keys_and_shapes(**TINY))
    args = fairseq_namespace(dict(TINY_ARGS, decoder_out_embed_dim=3))
    path = write_checkpoint(tmp_path / "m.pt", sd, args=args)
    _dicts(tmp_path)
    with pytest.raises(CheckpointError, match=r"shape mismatch.*decoder.fc2.bias"):
        load_fairseq(path)


# -- dictionaries ---------------------------------------------------------------------------------


def test_missing_dictionary_names_what_was_looked_for(tmp_path):
    path = _tiny_checkpoint(tmp_path, "args")
    (tmp_path / "dict.en.txt").unlink()
    with pytest.raises(CheckpointError) as e:
        load_fairseq(path)
    message = str(e.value)
    assert str(tmp_path / "dict.en.txt") in message and "de->en" in message
    assert "dict.de.txt" in message  # what is there


def test_dictionaries_from_dict_dir(tmp_path):
    path = _tiny_checkpoint(tmp_path, "args")
    elsewhere = tmp_path / "dicts"
    elsewhere.mkdir()
    for name in ("dict.de.txt", "dict.en.txt"):
        (tmp_path / name).rename(elsewhere / name)
    with pytest.raises(CheckpointError, match="dictionary not found"):
        load_fairseq(path)
    model, src_dict, _ = load_fairseq(path, dict_dir=elsewhere)
    assert len(src_dict) == 8


def test_vocabulary_size_mismatch_is_explained(tmp_path):
    path = _tiny_checkpoint(tmp_path, "args")
    write_dict(tmp_path / "dict.en.txt", 16)
    with pytest.raises(CheckpointError) as e:
        load_fairseq(path)
    message = str(e.value)
    assert "dict.en.txt gives 16 symbols" in message
    assert "decoder.embed_tokens.weight has 8 rows" in message
    assert "madeupword" in message


def test_swapped_language_pair_is_pointed_out(tmp_path):
    keys = fconv_keys_and_shapes(**dict(TINY, tgt_vocab=16))
    sd = fconv_state_dict(keys)
    path = write_checkpoint(tmp_path / "m.pt", sd, args=fairseq_namespace(TINY_ARGS))
    _dicts(tmp_path, src_size=8, tgt_size=16)
    load_fairseq(path)  # right way round
    with pytest.raises(CheckpointError, match="swapped"):
        load_fairseq(path, source_lang="en", target_lang="de")


def test_language_pair_inferred_from_dictionary_sizes(tmp_path):
    keys = fconv_keys_and_shapes(**dict(TINY, tgt_vocab=16))
    sd = fconv_state_dict(keys)
    args = fairseq_namespace(TINY_ARGS, source_lang=None, target_lang=None)
    path = write_checkpoint(tmp_path / "m.pt", sd, args=args)
    _dicts(tmp_path, src="fr", tgt="es", src_size=8, tgt_size=16)
    _, src_dict, tgt_dict = load_fairseq(path)
    assert (len(src_dict), len(tgt_dict)) == (8, 16) and src_dict[4] == "s0"
    write_dict(tmp_path / "dict.it.txt", 16)  # now two candidates for the target
    with pytest.raises(CheckpointError, match="does not name its language pair"):
        load_fairseq(path)


def _unnamed_pair_checkpoint(folder: Path, form: str = "args", tgt_vocab: int = 8) -> Path:
    """A checkpoint naming no languages, with dict.de.txt (8) and dict.en.txt beside it."""
    keys = fconv_keys_and_shapes(**dict(TINY, tgt_vocab=tgt_vocab))
    args = fairseq_namespace(TINY_ARGS, source_lang=None, target_lang=None)
    path = folder / "checkpoint_best.pt"
    if form == "args":
        write_checkpoint(path, fconv_state_dict(keys), args=args)
    else:
        write_checkpoint(path, fconv_state_dict(keys), args=None, cfg=fairseq_container(args))
    _dicts(folder, src="de", tgt="en", src_size=8, tgt_size=tgt_vocab)
    return path


@pytest.mark.parametrize("form", ["args", "container"])
def test_language_pair_read_from_the_databin_file_names(tmp_path, form):
    path = _unnamed_pair_checkpoint(tmp_path, form)  # same sizes: the sizes cannot tell
    with pytest.raises(CheckpointError, match="does not name its language pair"):
        load_fairseq(path)
    write_databin_files(tmp_path, "en", "de")
    _, src_dict, tgt_dict = load_fairseq(path)
    assert src_dict[4] == "t0" and tgt_dict[4] == "s0"  # en -> de, as the files say


def test_databin_file_names_in_dict_dir_and_only_idx_bin_names_count(tmp_path):
    path = _unnamed_pair_checkpoint(tmp_path)
    dicts = tmp_path / "databin"
    dicts.mkdir()
    for name in ("dict.de.txt", "dict.en.txt"):
        (tmp_path / name).rename(dicts / name)
    # names that are not a data-bin's: no pair from them
    for name in ("train.en-de.en.txt", "notes.en-de.idx", "train.en-de.fr.bin", "en-de.en.bin"):
        (dicts / name).write_bytes(b"")
    with pytest.raises(CheckpointError, match="does not name its language pair"):
        load_fairseq(path, dict_dir=dicts)
    write_databin_files(dicts, "en", "de", splits=("test",))
    _, src_dict, _ = load_fairseq(path, dict_dir=dicts)
    assert src_dict[4] == "t0"


def test_several_pairs_in_the_databin_file_names_are_refused_by_name(tmp_path):
    path = _unnamed_pair_checkpoint(tmp_path)
    write_databin_files(tmp_path, "de", "en")
    write_databin_files(tmp_path, "en", "de", splits=("valid",))
    with pytest.raises(CheckpointError) as e:
        load_fairseq(path)
    message = str(e.value)
    assert "de-en" in message and "en-de" in message and str(tmp_path) in message
    assert "source_lang=" in message and "gen.dict_dir" in message
    _, src_dict, _ = load_fairseq(path, source_lang="de", target_lang="en")  # the way out
    assert src_dict[4] == "s0"


def test_the_checkpoints_own_pair_wins_over_the_databin_file_names(tmp_path):
    path = _tiny_checkpoint(tmp_path, "args")  # names de -> en
    write_dict(tmp_path / "dict.fr.txt", 8, prefix="f")
    write_databin_files(tmp_path, "fr", "en")
    _, src_dict, _ = load_fairseq(path)
    assert src_dict[4] == "s0"


def test_without_databin_files_the_sizes_still_pick_the_pair(tmp_path):
    path = _unnamed_pair_checkpoint(tmp_path, tgt_vocab=16)
    (tmp_path / "train.de-en.de.txt").write_text("not a data-bin file\n")
    _, src_dict, tgt_dict = load_fairseq(path)
    assert (len(src_dict), len(tgt_dict)) == (8, 16) and tgt_dict[4] == "t0"


# -- files that are not (safe) checkpoints --------------------------------------------------------


class _RunsCommand:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _RunsPython:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",))


class _WritesOnSetstate:
    """A class whose unpickling (BUILD -> __setstate__) would write the marker."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __setstate__(self, state):
        open(state["marker"], "w").close()


@pytest.mark.parametrize(
    "payload, name",
    [
        (_RunsCommand, "system"),
        (_RunsPython, "builtins.exec"),
        (_WritesOnSetstate, "tests.checkpoints.test_fairseq._WritesOnSetstate"),
    ],
)
@pytest.mark.parametrize("zip_format", [True, False])
def test_checkpoint_with_code_is_refused_and_runs_nothing(tmp_path, payload, name, zip_format):
    marker = tmp_path / "marker"
    sd = fconv_state_dict(fconv_keys_and_shapes(**TINY))
    args = fairseq_namespace(TINY_ARGS)
    args.evil = payload(marker)  # hidden inside an otherwise ordinary fairseq checkpoint
    path = tmp_path / "checkpoint_best.pt"
    torch.save({"args": args, "model": sd}, path, _use_new_zipfile_serialization=zip_format)
    _dicts(tmp_path)
    allowed_before = set(torch.serialization.get_safe_globals())
    with pytest.raises(CheckpointError, match="refused to load") as e:
        load_fairseq(path)
    assert name in str(e.value)
    assert "weights_only=False" not in str(e.value)
    assert not marker.exists()
    # the allowlist was scoped to the call
    assert set(torch.serialization.get_safe_globals()) == allowed_before  # order is not kept
    assert not any("Namespace" in repr(g) for g in torch.serialization.get_safe_globals())


def test_allowlist_is_needed_and_scoped(tmp_path):
    """Without convseq's allowlist torch refuses a fairseq cfg checkpoint; with it, it loads."""
    path = _tiny_checkpoint(tmp_path, "dictconfig")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    state = read_checkpoint(path)
    assert set(state) >= {"cfg", "model", "optimizer_history", "extra_state"}
    with pytest.raises(pickle.UnpicklingError):  # and it is gone again afterwards
        torch.load(path, weights_only=True)


def test_every_global_in_a_fairseq_cfg_pickle_is_allowlisted_or_torch_default(tmp_path):
    path = _tiny_checkpoint(tmp_path, "dictconfig", numpy_metrics=True)
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    names = set()
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":  # resolved as the unpickler does (protocol 2 writes py2 names)
            module, name = arg.split(" ")
            module, name = NAME_MAPPING.get(
                (module, name), (IMPORT_MAPPING.get(module, module), name)
            )
            names.add(f"{module}.{name}")
    omegaconf = {
        n
        for n in names
        if n.startswith(("omegaconf", "argparse", "typing", "collections.defaultdict"))
    }
    assert omegaconf and omegaconf <= set(ALLOWED_GLOBALS)


@pytest.mark.parametrize("damage", ["truncated", "text", "empty", "list"])
def test_damaged_or_foreign_files_give_checkpoint_errors(tmp_path, damage):
    good = _tiny_checkpoint(tmp_path, "args")
    path = tmp_path / "bad.pt"
    if damage == "truncated":
        data = good.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif damage == "text":
        path.write_text("src tgt\nhello world\n")
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        torch.save([1, 2, 3], path)
    with pytest.raises(CheckpointError, match=str(path)):
        load_fairseq(path, dict_dir=tmp_path)


def test_missing_file_and_missing_model_entry(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_fairseq(tmp_path / "nope.pt")
    torch.save({"args": fairseq_namespace(TINY_ARGS)}, tmp_path / "m.pt")
    with pytest.raises(CheckpointError, match="no 'model' state dict"):
        load_fairseq(tmp_path / "m.pt")


# -- export -> import ------------------------------------------------------------------------------

ROUND_TRIP = dict(
    arch="fconv_toy",
    dropout=0.3,
    encoder_embed_dim=6,
    encoder_layers=[[4, 2], [6, 3], [6, 1, 2], [5, 3, 0]],
    decoder_embed_dim=6,
    decoder_layers=[[4, 2], [6, 3], [6, 2]],
    decoder_out_embed_dim=5,
    decoder_attention=[True, False, True],
    share_input_output_embed=False,
    max_source_positions=32,
    max_target_positions=40,
)


def _vocab(n: int, tag: str) -> Dictionary:
    return Dictionary.build([" ".join(f"{tag}{i}" for i in range(n))])


@pytest.mark.parametrize("style", ["args", "cfg"])
@pytest.mark.parametrize("share", [False, True])
def test_export_then_import_gives_identical_outputs(tmp_path, style, share):
    torch.manual_seed(0)
    cfg = dict(ROUND_TRIP, share_input_output_embed=share, decoder_out_embed_dim=6 if share else 5)
    src_dict, tgt_dict = _vocab(10, "a"), _vocab(17, "b")
    model = FConvModel.build(cfg, len(src_dict), len(tgt_dict)).eval()
    path = save_fairseq(
        model, tmp_path / "out" / "model.pt", src_dict, tgt_dict, "xx", "yy", args_style=style
    )
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "dict.xx.txt",
        "dict.yy.txt",
        "model.pt",
    ]

    loaded, src2, tgt2 = load_fairseq(path)
    assert src2 == src_dict and tgt2 == tgt_dict
    before, after = model.state_dict(), loaded.state_dict()
    assert list(before) == list(after)
    assert all(torch.equal(before[k], after[k]) for k in before)
    src = torch.tensor([[1, 5, 6, 7, 2], [8, 9, 4, 5, 2]])  # first row left-padded
    prev = torch.tensor([[2, 4, 9, 11], [2, 16, 5, 1]])
    with torch.no_grad():
        out_a, attn_a = model(src, torch.tensor([4, 5]), prev)
        out_b, attn_b = loaded(src, torch.tensor([4, 5]), prev)
    assert torch.equal(out_a, out_b) and torch.equal(attn_a, attn_b)
    assert parse_layers(loaded.cfg.encoder_layers) == parse_layers(cfg["encoder_layers"])
    assert loaded.cfg.decoder_attention == [True, False, True]


@pytest.mark.parametrize("style", ["args", "cfg"])
def test_exported_file_has_what_fairseqs_loader_reads(tmp_path, style):
    torch.manual_seed(0)
    src_dict, tgt_dict = _vocab(10, "a"), _vocab(17, "b")
    model = FConvModel.build(ROUND_TRIP, len(src_dict), len(tgt_dict))
    path = save_fairseq(
        model, tmp_path / "checkpoint_best.pt", src_dict, tgt_dict, "de", "en", args_style=style
    )
    state = read_checkpoint(path)
    assert set(state) >= {"args", "model", "optimizer_history", "extra_state"}
    last = state["optimizer_history"][-1]
    assert set(last) >= {"criterion_name", "optimizer_name", "lr_scheduler_state", "num_updates"}
    assert state["extra_state"]["train_iterator"]["epoch"] == 1
    if style == "args":
        args = state["args"]
        assert isinstance(args, argparse.Namespace)
        assert (args.task, args.arch, args.source_lang, args.target_lang) == (
            "translation",
            "fconv",
            "de",
            "en",
        )
        assert args.left_pad_source == "True"  # fairseq < 0.10 evaluates this string
    else:
        assert state["args"] is None and isinstance(state["cfg"], dict)
        task, model_ns = state["cfg"]["task"], state["cfg"]["model"]
        assert task["_name"] == "translation" and task["data"] == str(tmp_path.resolve())
        assert isinstance(model_ns, argparse.Namespace) and model_ns._name == "fconv"
        args = model_ns
    # fairseq's build_model evaluates these expressions (eval is fine here: test-side, our file)
    assert eval(args.encoder_layers) == [(4, 2), (6, 3), (6, 1, 2), (5, 3, 0)]
    assert eval(args.decoder_layers) == [(4, 2), (6, 3), (6, 2)]
    assert eval(args.decoder_attention) == [True, False, True]
    assert (args.max_source_positions, args.max_target_positions) == (32, 40)
    assert (args.encoder_embed_path, args.decoder_embed_path) == (None, None)
    assert state["model"]["decoder.version"].tolist() == [2.0]
    assert not list(tmp_path.glob(".*tmp"))  # the atomic write left no temporary file


def test_export_refuses_dictionaries_that_do_not_fit(tmp_path):
    src_dict, tgt_dict = _vocab(10, "a"), _vocab(17, "b")
    model = FConvModel.build(ROUND_TRIP, len(src_dict), len(tgt_dict))
    with pytest.raises(CheckpointError, match="dictionary size mismatch"):
        save_fairseq(model, tmp_path / "m.pt", src_dict, _vocab(30, "c"))
    assert not (tmp_path / "m.pt").exists()
