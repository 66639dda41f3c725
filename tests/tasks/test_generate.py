"""Generation: predict_step through trainer.predict, task=generate (files, BLEU, speed line),
fairseq checkpoints, ensembles, out-of-memory messages, and where the time goes."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import pytorch_lightning as pl
import sacrebleu
import torch

import convseq.inference.translator as translator_mod
import convseq.training.bleu as bleu_mod
from convseq.cli.dispatch import dispatch
from convseq.data.databin import DataBin
from convseq.data.datamodule import TranslationDataModule
from convseq.errors import DataError
from convseq.evaluation.scores import Scores, corpus_scores
from convseq.inference.ensemble import EnsembleModel
from convseq.inference.errors import GenerationOOM
from convseq.inference.generation import checkpoint_paths
from convseq.inference.options import GenConfig
from convseq.inference.records import in_input_order
from convseq.inference.translator import Translator
from convseq.search import beam_search
from convseq.tasks.generate import run_generate
from convseq.tasks.train import train
from convseq.training.module import ConvSeqModule
from tests.fairseq_ckpt_factory import (
    fairseq_namespace,
    fconv_keys_and_shapes,
    fconv_state_dict,
    write_checkpoint,
)
from tests.generation_utils import generate_config, tiny_checkpoint
from tests.training_utils import summary, tiny_config


@pytest.fixture
def tiny_ckpt(tiny_data, tmp_path_factory):
    return tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())


SIGNATURE = r"nrefs:1\|case:mixed\|eff:no\|tok:13a\|smooth:exp\|version:[\d.]+"


def refs_of(tiny, split="test"):
    """The raw reference file of the tiny corpus (not the data-bin)."""
    return (tiny["corpus"] / f"{split}.tgt").read_text(encoding="utf-8").splitlines()


# ---------------------------------------------------------------------------- predict_step


def test_predict_returns_each_sentence_in_input_order_with_the_token_budget_sampler(
    tiny_data, tiny_ckpt, tmp_path, one_thread
):
    module = ConvSeqModule.load_from_checkpoint(str(tiny_ckpt))
    module.translator().options = GenConfig(beam=3, max_len_b=10)
    cfg = tiny_config(tiny_data, tmp_path, "batching.max_tokens_valid=120")
    dm = TranslationDataModule(cfg.data, cfg.batching, cfg.paths.cache_dir, predict_split="test")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    predictions = trainer.predict(module, datamodule=dm)

    raw_ids = [r["id"] for batch in predictions for r in batch]
    assert len(predictions) > 3 and raw_ids != sorted(raw_ids)  # batched by length, not in order
    records = in_input_order(predictions)
    assert [r["id"] for r in records] == list(range(40))

    databin = DataBin(tiny_data["databin"])
    src, _ = databin.split("test")
    for i in (0, 11, 39):
        ids = torch.as_tensor(np.asarray(src[i]), dtype=torch.long)
        assert records[i]["src_symbols"] == [databin.src_dict[t] for t in ids.tolist()]
        alone = beam_search(module.model, ids[None], torch.tensor([len(ids)]), beam=3, max_len_b=10)
        hyp = records[i]["hypotheses"][0]
        assert hyp["tokens"].tolist() == alone[0][0]["tokens"].tolist()
        assert hyp["score"] == pytest.approx(alone[0][0]["score"], rel=1e-5)
        assert hyp["text"] == databin.decode(hyp["tokens"].tolist(), "tgt")
        assert hyp["attention"].shape == (len(ids), len(hyp["tokens"]))
        assert hyp["alignment"] == hyp["attention"].argmax(0).tolist()


def test_in_input_order_refuses_a_sentence_seen_twice():
    with pytest.raises(ValueError, match="sentence 3 was translated twice"):
        in_input_order([[{"id": 3}, {"id": 1}], [{"id": 3}]])


# ---------------------------------------------------------------------------- task=generate


def test_generate_writes_hypotheses_nbest_and_scores_against_the_raw_references(
    tiny_data, tiny_ckpt, tmp_path, capsys, one_thread
):
    out = tmp_path / "gen"
    result = dispatch(
        generate_config(tiny_data, out, f"ckpt={tiny_ckpt}", "gen.beam=3", "gen.nbest=2")
    )
    printed = capsys.readouterr().out
    # its first line: the threads it took and why (convseq.common.cpu_share.threads_line)
    assert re.match(r"convseq: threads per process: \d+ \(\S", printed)

    hyps = (out / "generate-test.txt").read_text(encoding="utf-8").splitlines()
    refs = refs_of(tiny_data)
    assert len(hyps) == len(refs) == 40
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    chrf = sacrebleu.corpus_chrf(hyps, [refs])
    m = re.search(rf"^BLEU\|{SIGNATURE} = (\d+\.\d\d) ", printed, re.M)
    assert m and float(m.group(1)) == round(bleu.score, 2)
    m = re.search(r"^chrF2\|nrefs:1\|.* = (\d+\.\d\d)$", printed, re.M)
    assert m and float(m.group(1)) == round(chrf.score, 2)
    # references rebuilt from the data-bin (unknown words as <unk>) would score differently
    databin = DataBin(tiny_data["databin"])
    rebuilt = [databin.decode(t, "tgt") for t in databin.split("test")[1]]
    assert rebuilt != refs
    assert sacrebleu.corpus_chrf(hyps, [rebuilt]).score != pytest.approx(chrf.score)

    m = re.search(
        r"^Translated 40 sentences \((\d+) tokens\) in [\d.]+s \([\d.]+ sentences/s, "
        r"[\d.]+ tokens/s\)$",
        printed,
        re.M,
    )
    assert m
    lines = (out / "generate-test.nbest.txt").read_text(encoding="utf-8").splitlines()
    h_lines = [ln.split("\t") for ln in lines if ln.startswith("H-")]
    d_lines = [ln.split("\t") for ln in lines if ln.startswith("D-")]
    assert sum(ln.startswith("S-") for ln in lines) == 40 and len(h_lines) == 80
    best = h_lines[0::2]
    assert [h[0] for h in best] == [f"H-{i}" for i in range(40)]
    assert all(float(a[1]) >= float(b[1]) for a, b in zip(h_lines[0::2], h_lines[1::2]))
    assert [d[2] if len(d) > 2 else "" for d in d_lines[0::2]] == hyps
    # scores in base 2, as fairseq prints them
    first = Translator.from_checkpoints(tiny_ckpt).translate_records(
        [(tiny_data["corpus"] / "test.src").read_text().splitlines()[0]], beam=3, max_len_b=12
    )[0]["hypotheses"][0]
    assert float(best[0][1]) == pytest.approx(first["score"] / np.log(2), abs=1e-5)
    p_line = next(ln for ln in lines if ln.startswith("P-0\t"))
    assert [float(x) for x in p_line.split("\t")[1].split()] == pytest.approx(
        (first["positional_scores"] / np.log(2)).tolist(), abs=1e-4
    )
    # tokens in the speed line: the best hypotheses' pieces plus their EOS
    assert int(m.group(1)) == sum(len(h[2].split()) + 1 for h in best) == result["tokens"]

    saved = json.loads((out / "generate-test.json").read_text())
    assert saved["scores"]["bleu"] == pytest.approx(bleu.score)
    assert saved["scores"]["bleu_signature"].startswith("BLEU|nrefs:1|")
    assert saved["options"]["beam"] == 3 and saved["sentences"] == 40


def test_generate_from_a_fairseq_checkpoint_gives_the_convseq_models_output(
    tiny_data, tiny_ckpt, tmp_path, one_thread
):
    module = ConvSeqModule.load_from_checkpoint(str(tiny_ckpt))
    databin = DataBin(tiny_data["databin"])
    keys = fconv_keys_and_shapes(
        src_vocab=len(databin.src_dict),
        tgt_vocab=len(databin.tgt_dict),
        encoder_embed_dim=16,
        encoder_layers=[(16, 3)],
        decoder_embed_dim=16,
        decoder_layers=[(16, 3)],
        decoder_out_embed_dim=16,
        attention=[True],
    )
    values = {k: v.numpy() for k, v in module.model.state_dict().items() if k != "decoder.version"}
    folder = tmp_path / "fairseq"
    folder.mkdir()
    args = fairseq_namespace(
        {
            "arch": "fconv",
            "dropout": 0.1,
            "encoder_embed_dim": 16,
            "encoder_layers": "[(16, 3)]",
            "decoder_embed_dim": 16,
            "decoder_layers": "[(16, 3)]",
            "decoder_out_embed_dim": 16,
            "decoder_attention": "True",
            "share_input_output_embed": False,
        },
        source_lang="src",
        target_lang="tgt",
    )
    pt = write_checkpoint(folder / "checkpoint_best.pt", fconv_state_dict(keys, values), args=args)
    for lang in ("src", "tgt"):
        (folder / f"dict.{lang}.txt").write_bytes((databin.path / f"dict.{lang}.txt").read_bytes())

    ours = run_generate(generate_config(tiny_data, tmp_path / "a", f"ckpt={tiny_ckpt}"))
    # a fairseq checkpoint records no data: the command line names it (data=NAME)
    theirs = run_generate(generate_config(tiny_data, tmp_path / "b", f"ckpt={pt}", "data=toy"))
    assert theirs["sentences"] == 40
    assert (tmp_path / "b" / "generate-test.txt").read_text() == (
        tmp_path / "a" / "generate-test.txt"
    ).read_text()
    assert theirs["scores"]["bleu"] == ours["scores"]["bleu"]


def test_generate_refuses_a_split_without_reference_text(tiny_data, tiny_ckpt, tmp_path):
    with pytest.raises(DataError, match="gen.split='train'"):
        run_generate(generate_config(tiny_data, tmp_path, f"ckpt={tiny_ckpt}", "gen.split=train"))


def test_impossible_search_settings_stop_generate_with_one_clear_line(
    tiny_data, tiny_ckpt, tmp_path, capsys
):
    with pytest.raises(SystemExit) as exit_info:
        dispatch(generate_config(tiny_data, tmp_path, f"ckpt={tiny_ckpt}", "gen.min_len=20"))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "generation settings (gen.*): sentence" in err and "below min_len 20" in err


def test_checkpoint_paths_split_an_ensemble_on_colons():
    assert checkpoint_paths("a.ckpt:dir/b.pt") == ["a.ckpt", "dir/b.pt"]
    assert checkpoint_paths(["a.ckpt", "b.ckpt"]) == ["a.ckpt", "b.ckpt"]


# ---------------------------------------------------------------------------- ensembles


def test_an_ensemble_of_two_identical_checkpoints_gives_the_single_models_output(
    tiny_data, tiny_ckpt, one_thread
):
    lines = (tiny_data["corpus"] / "test.src").read_text(encoding="utf-8").splitlines()[:12]
    single = Translator.from_checkpoints(tiny_ckpt)
    pair = Translator.from_checkpoints([tiny_ckpt, tiny_ckpt])
    assert isinstance(pair.search_model, EnsembleModel) and len(pair.search_model) == 2
    a = single.translate_records(lines, beam=4, nbest=2, max_len_b=10)
    b = pair.translate_records(lines, beam=4, nbest=2, max_len_b=10)
    for ra, rb in zip(a, b, strict=True):
        for ha, hb in zip(ra["hypotheses"], rb["hypotheses"], strict=True):
            assert ha["tokens"].tolist() == hb["tokens"].tolist() and ha["text"] == hb["text"]
            assert hb["score"] == pytest.approx(ha["score"], rel=1e-5, abs=1e-6)
            torch.testing.assert_close(hb["attention"], ha["attention"])


def test_an_ensemble_averages_the_members_probabilities_at_every_step(tiny_data, tiny_ckpt):
    first = ConvSeqModule.load_from_checkpoint(str(tiny_ckpt)).model.eval()
    second = ConvSeqModule.load_from_checkpoint(str(tiny_ckpt)).model.eval()
    with torch.no_grad():
        for p in second.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ensemble = EnsembleModel([first, second])
    src = torch.tensor([[1, 1, 7, 8, 9, 2], [10, 11, 12, 13, 14, 2]])
    lengths = torch.tensor([4, 6])
    prev = torch.tensor([[2, 5, 6], [2, 7, 4]])
    with torch.no_grad():
        state: dict = {}
        enc = ensemble.encode(src, lengths)
        for t in range(prev.size(1)):
            got, _ = ensemble.decode(prev[:, : t + 1], enc, state)
            probs = []
            for m in (first, second):
                logits, _ = m(src, lengths, prev[:, : t + 1])  # full forward, no state
                probs.append(torch.softmax(logits[:, -1].float(), dim=-1))
            torch.testing.assert_close(
                got, torch.log((probs[0] + probs[1]) / 2), atol=1e-5, rtol=1e-5
            )


def test_ensemble_members_must_share_dictionaries(tiny_ckpt, tmp_path):
    ckpt = torch.load(tiny_ckpt, weights_only=True)
    hp = ckpt["hyper_parameters"]
    hp["tgt_vocab"] = hp["tgt_vocab"][:4] + list(reversed(hp["tgt_vocab"][4:]))
    other = tmp_path / "other.ckpt"
    torch.save(ckpt, other)
    with pytest.raises(Exception, match="tgt dictionary differs"):
        Translator.from_checkpoints([tiny_ckpt, other])


# ---------------------------------------------------------------------------- out of memory


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: out of memory"),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes. Error code 12 (Cannot allocate memory) out of memory"
        ),
    ],
)
def test_out_of_memory_during_generation_says_to_lower_max_tokens(
    tiny_data, tiny_ckpt, tmp_path, monkeypatch, capsys, error
):
    def oom(*args, **kwargs):
        raise error

    monkeypatch.setattr(translator_mod, "beam_search", oom)
    with pytest.raises(GenerationOOM, match=r"lower gen\.max_tokens"):
        Translator.from_checkpoints(tiny_ckpt).translate(["a b c"])
    with pytest.raises(SystemExit) as exit_info:
        dispatch(generate_config(tiny_data, tmp_path, f"ckpt={tiny_ckpt}"))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "out of memory" in err and "lower gen.max_tokens" in err


def test_other_runtime_errors_are_not_reported_as_out_of_memory(tiny_ckpt, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(translator_mod, "beam_search", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        Translator.from_checkpoints(tiny_ckpt).translate(["a b c"])


# ---------------------------------------------------------------------------- BLEU in training


def test_corpus_scores_match_sacrebleu_and_carry_signatures():
    hyps = ["the cat sat on the mat", "a dog ."]
    refs = ["the cat sat on a mat", "a dog barked ."]
    s = corpus_scores(hyps, refs)
    assert s.bleu == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert s.chrf == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert re.fullmatch(rf"BLEU\|{SIGNATURE}", s.bleu_signature)
    assert s.lines()[0].startswith(s.bleu_signature + f" = {s.bleu:.2f} ")
    with pytest.raises(DataError, match="2 hypotheses for 1 references"):
        corpus_scores(hyps, refs[:1])


def test_validation_bleu_picks_best_ckpt_and_test_bleu_uses_the_best_weights(
    tiny_data, tmp_path, monkeypatch, capsys, one_thread
):
    # Validation BLEU is scripted (10, 30, 20) so that the best epoch by BLEU (2) is not the
    # best by loss (3, the loss falls every epoch): best.ckpt must follow the BLEU.
    scripted = iter([10.0, 30.0, 20.0])
    real = bleu_mod.model_scores

    def fake(module, databin, split, gen):
        if split == "test":  # the end-of-training test BLEU: the real thing, checked below
            return real(module, databin, split, gen)
        assert split == "valid"
        value = next(scripted)
        return Scores(value, 0.0, "BLEU|x", "chrF2|x", "", "", 40), []

    monkeypatch.setattr(bleu_mod, "model_scores", fake)
    out = tmp_path / "run"
    cfg = tiny_config(
        tiny_data,
        out,
        "trainer.max_epochs=3",
        "checkpoint.monitor=valid/bleu",
        "checkpoint.mode=max",
        "optimized_metric=valid/bleu",
        "gen.max_len_b=12",
        "profile=true",
    )
    assert train(cfg) == 30.0
    s = summary(out)
    assert [h["valid/bleu"] for h in s["history"]] == [10.0, 30.0, 20.0]
    losses = [h["valid/loss"] for h in s["history"]]
    assert losses[2] < losses[1]  # by loss, epoch 3 would have been kept
    best = torch.load(out / "checkpoints" / "best.ckpt", weights_only=True)
    assert best["epoch"] == 1  # Lightning's 0-based epoch of the second epoch
    assert (s["best_epoch"], s["best_value"]) == (2, 30.0)  # the summary names best.ckpt's epoch

    # test BLEU: the best checkpoint translating the test split, scored on the raw references
    monkeypatch.setattr(bleu_mod, "model_scores", real)
    hyps = Translator.from_checkpoints(out / "checkpoints" / "best.ckpt").translate(
        (tiny_data["corpus"] / "test.src").read_text().splitlines(), max_len_b=12
    )
    expected = corpus_scores(hyps, refs_of(tiny_data))
    assert s["test"]["test/bleu"] == pytest.approx(expected.bleu)
    assert s["test"]["test/chrf"] == pytest.approx(expected.chrf)
    printed = capsys.readouterr().out
    assert re.search(rf"^convseq: test BLEU\|{SIGNATURE} = ", printed, re.M)

    # profile=true beside validation BLEU: one training-epoch breakdown per epoch (its parts are
    # checked in tests/training/test_profiler.py)
    assert len(s["profile"]["epochs"]) == 3
    assert "Where the time goes (training epoch" in printed


def test_bleu_every_n_epochs_must_be_1_when_bleu_picks_the_checkpoint(tiny_data, tmp_path):
    cfg = tiny_config(tiny_data, tmp_path, "checkpoint.monitor=valid/bleu", "bleu_every_n_epochs=2")
    with pytest.raises(DataError, match="bleu_every_n_epochs=1"):
        train(cfg)
