"""The Python API knows which data a checkpoint was trained on: Translator.trained_on, ensembles
that must agree on it, translate_split refusing another corpus's data-bin, and the record
comparisons behind them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from convseq.checkpoints.data_record import (
    DATA_HPARAMS,
    data_differences,
    describe,
    segmentation_differs,
    training_data,
)
from convseq.checkpoints.io import TEXT_KEY
from convseq.data.corpus_dir import with_corpus_dir
from convseq.data.databin import DataBin
from convseq.data.preprocess import as_data_config, prepare_databin
from convseq.data.toy.corpus import write_toy_corpus
from convseq.errors import CheckpointError
from convseq.inference.data_match import TrainedOn, check_given_data, data_to_translate
from convseq.inference.errors import DataMismatchError
from convseq.inference.generation import translate_split
from convseq.inference.options import GenConfig
from convseq.inference.translator import Translator
from tests.generation_utils import tiny_checkpoint
from tests.training_utils import tiny_config


@pytest.fixture
def tiny_ckpt(tiny_data, tmp_path_factory):
    return tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())


def edited_checkpoint(src: Path, dst: Path, edit) -> Path:
    ckpt = torch.load(src, weights_only=True)
    edit(ckpt)
    torch.save(ckpt, dst)
    return dst


def test_a_translator_knows_the_data_its_checkpoint_was_trained_on(tiny_data, tiny_ckpt):
    translator = Translator.from_checkpoints(tiny_ckpt)
    data = translator.trained_on.data
    assert data is not None and data["dir"] == str(tiny_data["corpus"])
    assert (data["name"], data["src_lang"], data["tgt_lang"]) == ("toy", "src", "tgt")
    assert translator.trained_on.describe() == "src->tgt (toy)"
    assert training_data(torch.load(tiny_ckpt, weights_only=True)) == data


def test_ensemble_members_trained_on_other_data_are_refused_by_name(tiny_ckpt, tmp_path):
    def other_subwords(ckpt):  # same dictionaries, other recorded segmentation settings
        ckpt[DATA_HPARAMS]["data"]["subword"]["type"] = "bpe"

    other = edited_checkpoint(tiny_ckpt, tmp_path / "other.ckpt", other_subwords)
    with pytest.raises(CheckpointError) as e:
        Translator.from_checkpoints([tiny_ckpt, other])
    assert f"{other} was trained on src->tgt (toy), {tiny_ckpt} on src->tgt (toy)" in str(e.value)
    assert "data.subword.type: 'none' vs 'bpe'" in str(e.value)

    same = edited_checkpoint(tiny_ckpt, tmp_path / "same.ckpt", lambda ckpt: None)
    assert len(Translator.from_checkpoints([tiny_ckpt, same]).models) == 2


def test_translate_split_refuses_a_databin_of_another_corpus(tiny_data, tiny_ckpt, tmp_path):
    other = tmp_path / "corpus"
    write_toy_corpus(other, seed=11, n_train=80, n_valid=8, n_test=8)
    cfg = tiny_config({"corpus": other, "cache": tmp_path / "cache"}, tmp_path / "unused")
    databin = DataBin(prepare_databin(cfg.data, cfg.paths.cache_dir, progress=False))
    translator = Translator.from_checkpoints(tiny_ckpt)
    with pytest.raises(DataMismatchError, match=r"the target dictionary: 800 vs \d+ symbols"):
        translate_split(translator, databin, "test", GenConfig(max_tokens=600))
    # its own data-bin passes the check and is translated
    own = translate_split(
        translator, DataBin(tiny_data["databin"]), "valid", GenConfig(max_tokens=600)
    )
    assert len(own) == 40


def test_check_given_data_names_the_pair_and_passes_the_same_settings(tiny_ckpt):
    model = Translator.from_checkpoints(tiny_ckpt).trained_on
    same = {**model.data, "dir": "/somewhere/else", "test_sets": {"extra": "x"}}
    check_given_data(model, same)  # another folder and more test sets: the same data
    with pytest.raises(DataMismatchError, match=r"^checkpoint src->tgt \(toy\), data de->en"):
        check_given_data(model, {**model.data, "src_lang": "de", "tgt_lang": "en"})


def test_a_checkpoint_without_a_record_checks_nothing(tiny_ckpt, tmp_path):
    def strip(ckpt):
        del ckpt[DATA_HPARAMS], ckpt[TEXT_KEY]

    bare = Translator.from_checkpoints(edited_checkpoint(tiny_ckpt, tmp_path / "b.ckpt", strip))
    assert bare.trained_on.data is None and bare.trained_on.text is None
    check_given_data(bare.trained_on, {"name": "x", "src_lang": "de", "tgt_lang": "en"})


def test_data_differences_compare_only_what_decides_the_ids():
    base = {
        "name": "c",
        "dir": "/a",
        "src_lang": "de",
        "tgt_lang": "en",
        "subword": {"type": "none", "vocab_size": 8000},
        "vocab": {"joined": False, "nwords": -1},
        "max_positions": 1022,
    }
    moved = {**base, "dir": "/b", "name": "d", "subword": {"type": "none", "vocab_size": 4000}}
    assert data_differences(base, moved) == []  # no subwords: their size is unused
    bpe = {**base, "subword": {"type": "bpe", "vocab_size": 8000}}
    bpe4k = {**base, "subword": {"type": "bpe", "vocab_size": 4000}}
    assert data_differences(bpe, bpe4k) == [("subword.vocab_size", 8000, 4000)]
    assert data_differences(base, bpe) == [("subword.type", "none", "bpe")]
    flipped = {**base, "src_lang": "en", "tgt_lang": "de", "vocab": {"joined": True}}
    assert data_differences(base, flipped) == [
        ("src_lang", "de", "en"),
        ("tgt_lang", "en", "de"),
        ("vocab.joined", False, True),
    ]
    assert describe(base) == "de->en (c)" and describe(None) == "an unrecorded language pair"
    text = {"src_spm": b"a", "tgt_spm": None}
    assert segmentation_differs(text, {"src_spm": b"b", "tgt_spm": None}) == ["source"]
    assert segmentation_differs(text, None) == []


def test_a_generated_corpus_whose_folder_is_gone_is_generated_in_this_cache(tmp_path):
    recorded = {"name": "toy", "dir": "/no/such/cache/corpora/toy-seed1", "generator": "toy"}
    model = TrainedOn(("a.ckpt",), {**recorded, "src_lang": "src", "tgt_lang": "tgt"}, None)
    data = data_to_translate(model, None)
    # dir unset: the generator writes into its own folder of this cache, and only there
    assert data.dir is None and data.generator == "toy"
    folder = with_corpus_dir(as_data_config(data), tmp_path / "cache").dir
    assert folder == str(tmp_path / "cache" / "corpora" / "toy-seed1")
    assert (tmp_path / "cache" / "corpora" / "toy-seed1" / "train.src").is_file()
    # what a run records today (the toy group leaves dir unset) is translated the same way
    unset = TrainedOn(model.checkpoints, {**model.data, "dir": None}, None)
    assert data_to_translate(unset, None).dir is None
    without = TrainedOn(model.checkpoints, {**model.data, "generator": None}, None)
    with pytest.raises(DataMismatchError, match="/no/such/cache/corpora/toy-seed1, a folder"):
        data_to_translate(without, None)
