"""The notebook/script API: ConvSeqModule.translate, Translator, and the segmentation that
travels inside checkpoints."""

from __future__ import annotations

import dataclasses
import inspect
import logging

import numpy as np
import pytest
import torch

from convseq.checkpoints.io import TEXT_KEY
from convseq.data.dictionary import Dictionary
from convseq.data.subword import segmenters, text_processing, train_sentencepiece
from convseq.inference.options import SEARCH_KEYS, GenConfig
from convseq.inference.translator import Translator, numbered
from convseq.search import beam_search
from convseq.training.module import ConvSeqModule
from tests.generation_utils import tiny_checkpoint


@pytest.fixture
def tiny_ckpt(tiny_data, tmp_path_factory):
    return tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())


def test_module_translate_is_the_beam_search_of_the_encoded_text(tiny_data, tiny_ckpt, one_thread):
    lines = (tiny_data["corpus"] / "test.src").read_text(encoding="utf-8").splitlines()[:6]
    module = ConvSeqModule.load_from_checkpoint(str(tiny_ckpt))  # weights_only, no data needed
    module.train()
    got = module.translate(lines, beam=5, max_len_b=12)
    assert got == Translator.from_checkpoints(tiny_ckpt).translate(lines, beam=5, max_len_b=12)
    for line, text in zip(lines, got, strict=True):
        ids = torch.as_tensor(module.src_dict.encode(line.split()), dtype=torch.long)
        best = beam_search(module.model, ids[None], torch.tensor([len(ids)]), max_len_b=12)[0][0]
        assert text == module.tgt_dict.string(best["tokens"].tolist())
    # one string in, one string out; nbest gives lists whose first entry is the best
    assert module.translate(lines[0], max_len_b=12) == got[0]
    nbest = module.translate(lines[:2], beam=4, nbest=3, max_len_b=12)
    assert [len(n) for n in nbest] == [3, 3] and [n[0] for n in nbest] == module.translate(
        lines[:2], beam=4, max_len_b=12
    )
    assert module.training and module.model.training  # translating restores the train mode


def test_training_checkpoints_carry_their_segmentation(tiny_ckpt):
    ckpt = torch.load(tiny_ckpt, weights_only=True)
    assert ckpt[TEXT_KEY] == {
        "src_lang": "src",
        "tgt_lang": "tgt",
        "src_spm": None,
        "tgt_spm": None,
    }
    module = ConvSeqModule.load_from_checkpoint(str(tiny_ckpt))
    assert module.text_processing == ckpt[TEXT_KEY]


def test_sentencepiece_travels_in_the_checkpoint_and_is_applied_both_ways(tmp_path, one_thread):
    sentences = [f"the quick brown fox number {i} jumps over lazy dogs" for i in range(200)]
    spm = train_sentencepiece(sentences, tmp_path / "spm.model", "bpe", vocab_size=60)
    pieces = sorted({p for s in sentences for p in spm.segment(s)})
    vocab = Dictionary()
    for p in pieces:
        vocab.add_symbol(p)
    model_cfg = {
        "encoder_embed_dim": 16,
        "decoder_embed_dim": 16,
        "decoder_out_embed_dim": 16,
        "encoder_layers": [[16, 3]],
        "decoder_layers": [[16, 3]],
    }
    torch.manual_seed(0)
    module = ConvSeqModule(model_cfg, vocab.to_list(), vocab.to_list())
    module.text_processing = text_processing("en", "xx", spm, spm)
    checkpoint = {
        "state_dict": module.state_dict(),
        "hyper_parameters": dict(module.hparams),
        "pytorch-lightning_version": "2.6.0",
    }
    module.on_save_checkpoint(checkpoint)
    path = tmp_path / "spm.ckpt"
    torch.save(checkpoint, path)

    loaded = ConvSeqModule.load_from_checkpoint(str(path))  # weights_only: bytes are allowed
    translator = loaded.translator()
    assert translator.src_segmenter.model is not None
    line = "the lazy fox number 7"
    ids, truncated = translator.encode(line)
    assert not truncated
    assert [vocab[i] for i in ids[:-1]] == spm.segment(line)  # the training data's pieces
    record = translator.translate_records([line], beam=2, max_len_b=6)[0]
    hyp = record["hypotheses"][0]
    pieces = [p for p in hyp["symbols"] if p not in ("<s>", "<pad>", "</s>")]
    assert hyp["text"] == spm.detokenize(pieces)  # pieces joined back, specials dropped
    assert "\u2581" not in hyp["text"]
    assert record["src_symbols"] == [*spm.segment(line), "</s>"]


def test_segmenters_default_to_whitespace():
    src, tgt = segmenters(None)
    assert src.segment(" a  b ") == ["a", "b"] and tgt.detokenize(["a", "b"]) == "a b"


def test_overlong_input_is_truncated_with_a_warning(tiny_ckpt, caplog):
    translator = Translator.from_checkpoints(tiny_ckpt)
    line = " ".join(["w"] * 1500)
    ids, truncated = translator.encode(line)
    assert truncated and len(ids) == 1022 and ids[-1] == translator.src_dict.eos()
    with caplog.at_level(logging.WARNING, logger="convseq.inference.translator"):
        out = translator.translate([line, "w w"], max_len_b=3)
    assert len(out) == 2
    assert "sentence 0: longer than the model's 1022 source positions; truncated" in caplog.text


def test_encode_lines_reports_the_truncated_lines_in_one_message(tiny_ckpt):
    translator = Translator.from_checkpoints(tiny_ckpt)
    lines = ["w w", " ".join(["w"] * 1500), "w", " ".join(["w"] * 2000)]
    messages = []
    encoded, cut = translator.encode_lines(lines, lambda c: numbered("line", c), messages.append)
    assert cut == [1, 3]
    assert [len(ids) for ids in encoded] == [3, 1022, 2, 1022]
    for ids, line in zip(encoded, lines):
        assert ids.tolist() == translator.encode(line)[0].tolist()
    assert messages == [
        "lines 1, 3: longer than the model's 1022 source positions; truncated to the first "
        "1021 tokens and the EOS"
    ]
    messages.clear()
    assert translator.encode_lines(["w"], lambda c: "never", messages.append)[1] == []
    assert messages == []


def test_numbered_names_one_or_several_and_cuts_long_lists():
    assert numbered("line", [4]) == "line 4"
    assert numbered("sentence", [0, 3]) == "sentences 0, 3"
    assert numbered("line", list(range(1, 13))) == "lines 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ..."


def test_translate_batches_by_max_tokens_or_sentences_with_the_same_results(tiny_ckpt):
    translator = Translator.from_checkpoints(tiny_ckpt)
    rng = np.random.default_rng(0)
    words = translator.src_dict.symbols[4:60]
    lines = [" ".join(rng.choice(words, size=rng.integers(1, 15))) for _ in range(25)]
    lines.insert(3, "")  # an empty sentence translates too
    whole = translator.translate(lines, max_tokens=None, batch_size=None, max_len_b=8)
    assert translator.translate(lines, max_tokens=40, max_len_b=8) == whole
    assert translator.translate(lines, max_tokens=None, batch_size=3, max_len_b=8) == whole


def test_unknown_generation_options_are_refused():
    with pytest.raises(TypeError, match=r"unknown generation option\(s\) \['beam_size'\]"):
        GenConfig().updated(beam_size=3)
    two = GenConfig(max_tokens=10).updated(beam=2)
    assert (two.beam, two.max_tokens, two.nbest) == (2, 10, 1)  # the rest kept


def test_gen_config_updated_is_a_copy_and_search_kwargs_are_the_search_keys():
    gen = GenConfig(beam=4, max_tokens=10)
    three = gen.updated(beam=3, nbest=2)
    assert three is not gen and gen.beam == 4 and gen.nbest == 1  # the original unchanged
    assert three == dataclasses.replace(gen, beam=3, nbest=2)
    assert gen.updated() is gen  # nothing to change: the same settings
    kwargs = three.search_kwargs()
    assert tuple(kwargs) == SEARCH_KEYS and kwargs["beam"] == 3 and kwargs["nbest"] == 2
    # the batching and task keys are no search argument; every search key is one of beam_search's
    assert "max_tokens" not in kwargs and "precision" not in kwargs
    assert set(kwargs) <= set(inspect.signature(beam_search).parameters)


def test_generation_batches_are_pinned_when_the_module_is_on_a_gpu(monkeypatch):
    """Page-locked batches copy to a GPU without blocking the host; on the CPU they would cost
    a copy for nothing."""
    import types

    from torch import nn

    from convseq.data.dataset import LanguagePairDataset
    from convseq.inference.generation import GenerationModule, batch_loader

    asked = []
    stub = types.SimpleNamespace(models=[nn.Linear(1, 1)], max_source_positions=lambda: 100)
    module = GenerationModule(stub, None, lambda **kw: asked.append(kw) or kw)
    module._trainer = types.SimpleNamespace(world_size=2, global_rank=1)
    for device in (torch.device("cpu"), torch.device("cuda", 0)):
        module._device = device
        module.predict_dataloader()
    assert asked == [
        {"shard_of": (1, 2), "pin_memory": False},
        {"shard_of": (1, 2), "pin_memory": True},
    ]
    data = LanguagePairDataset([np.array([4, 5, 2]), np.array([6, 2])], None, pad=1)
    gen = GenConfig(max_tokens=100, batch_size=None)
    # (a pinned DataLoader needs CUDA to exist: what it is given is checked instead)
    monkeypatch.setattr("convseq.inference.generation.DataLoader", lambda *a, **kw: kw)
    assert batch_loader(data, stub, gen, "x", pin_memory=True)["pin_memory"] is True
    assert batch_loader(data, stub, gen, "x")["pin_memory"] is False
