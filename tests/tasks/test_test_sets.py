"""data.test_sets: extra evaluation sets binarised beside the test split, scored at the end of
training (one line each) and translatable with task=generate gen.split=<name>."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from convseq.data.config import DataConfig
from convseq.data.databin import DataBin
from convseq.data.preprocess import databin_path, prepare_databin
from convseq.errors import DataError
from convseq.tasks.generate import run_generate
from convseq.tasks.train import train
from tests.generation_utils import FAST_GEN, generate_config
from tests.training_utils import tiny_config


@pytest.fixture(scope="module")
def corpus_with_sets(tiny_data, tmp_path_factory) -> dict[str, Path]:
    """The tiny corpus plus `rev.*` (the test split, lines reversed) and `head.*` (its first 15)."""
    root = tmp_path_factory.mktemp("test_sets")
    corpus = root / "corpus"
    shutil.copytree(tiny_data["corpus"], corpus)
    for lang in ("src", "tgt"):
        lines = (corpus / f"test.{lang}").read_text(encoding="utf-8").splitlines()
        (corpus / f"rev.{lang}").write_text("\n".join(lines[::-1]) + "\n", encoding="utf-8")
        (corpus / f"head.{lang}").write_text("\n".join(lines[:15]) + "\n", encoding="utf-8")
    return {"corpus": corpus, "cache": root / "cache"}


def data_cfg(tiny: dict[str, Path], *overrides: str) -> DataConfig:
    return tiny_config(tiny, tiny["cache"].parent / "unused", *overrides).data


SETS = "++data.test_sets={reversed:rev,first15:head}"


def test_extra_sets_are_binarised_like_the_test_split(corpus_with_sets):
    db = DataBin(prepare_databin(data_cfg(corpus_with_sets, SETS), str(corpus_with_sets["cache"])))
    assert db.test_sets == ["reversed", "first15"]
    assert db.scored_splits() == ["valid", "test", "reversed", "first15"]
    test_src, test_tgt = db.split("test")
    rev_src, rev_tgt = db.split("reversed")
    n = len(test_src)
    assert len(rev_src) == n and len(db.split("first15")[0]) == 15
    for i in range(n):  # the same ids, in reverse line order
        assert np.array_equal(np.asarray(rev_src[i]), np.asarray(test_src[n - 1 - i]))
        assert np.array_equal(np.asarray(rev_tgt[i]), np.asarray(test_tgt[n - 1 - i]))
    assert db.text("reversed", "tgt") == db.text("test", "tgt")[::-1]
    assert db.text("first15", "src") == db.text("test", "src")[:15]
    assert db.meta["splits"]["reversed"]["input"] == "rev"
    assert db.meta["inputs"]["reversed.src"]["path"].endswith("rev.src")
    with pytest.raises(DataError, match="not 'train'"):
        db.text("train")


def test_a_corpus_without_extra_sets_keeps_its_data_bin(corpus_with_sets, tiny_data):
    # the copied corpus has the same bytes as the tiny corpus: without test_sets, the same key
    plain = databin_path(data_cfg(corpus_with_sets), str(corpus_with_sets["cache"]))
    assert plain.name == Path(tiny_data["databin"]).name
    with_sets = databin_path(data_cfg(corpus_with_sets, SETS), str(corpus_with_sets["cache"]))
    assert with_sets.name != plain.name


@pytest.mark.parametrize(
    "sets, words",
    [
        ({"valid": "rev"}, "data.test_sets.valid: a test set's name must differ"),
        ({"a b": "rev"}, "data.test_sets.a b: a test set's name"),
        ({"x": "sub/rev"}, "data.test_sets.x='sub/rev': give the input file prefix"),
        ({"x": "missing"}, r"missing\.src: input text file not found"),
    ],
)
def test_bad_test_sets_are_refused_by_name(corpus_with_sets, sets, words):
    cfg = dataclasses.replace(data_cfg(corpus_with_sets), test_sets=sets)
    with pytest.raises(DataError, match=words):
        prepare_databin(cfg, str(corpus_with_sets["cache"]))


def test_extra_set_checks_name_file_and_line(corpus_with_sets, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(corpus_with_sets["corpus"], corpus)
    tiny = {"corpus": corpus, "cache": tmp_path / "cache"}
    (corpus / "bad.src").write_bytes(b"ok line\nbroken \xff line\n")
    (corpus / "bad.tgt").write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        prepare_databin(data_cfg(tiny, "++data.test_sets={b:bad}"), str(tiny["cache"]))
    assert "bad.src" in str(info.value) and ":2" in str(info.value)
    (corpus / "bad.src").write_text("only one line\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.(src|tgt)"):
        prepare_databin(data_cfg(tiny, "++data.test_sets={b:bad}"), str(tiny["cache"]))


def test_training_scores_every_test_set_one_line_each(
    corpus_with_sets, tmp_path, capsys, one_thread
):
    run = tmp_path / "run"
    cfg = tiny_config(corpus_with_sets, run, "trainer.max_epochs=1", *FAST_GEN, SETS)
    train(cfg)
    out = capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    sets = summary["test_sets"]
    assert sorted(sets) == ["first15", "reversed"]
    test_hyps = (run / "generate-test.txt").read_text(encoding="utf-8").splitlines()
    rev_hyps = (run / "generate-reversed.txt").read_text(encoding="utf-8").splitlines()
    head_hyps = (run / "generate-first15.txt").read_text(encoding="utf-8").splitlines()
    # each sentence translates the same wherever it sits: the files are in their input order
    assert rev_hyps == test_hyps[::-1]
    assert head_hyps == test_hyps[:15]
    refs = DataBin(databin_path(cfg.data, cfg.paths.cache_dir)).text("test", "tgt")
    head_bleu = sacrebleu.corpus_bleu(head_hyps, [refs[:15]]).score
    assert sets["first15"]["bleu"] == pytest.approx(head_bleu)
    assert sets["first15"]["sentences"] == 15
    # corpus BLEU does not depend on the order of the pairs
    assert sets["reversed"]["bleu"] == pytest.approx(summary["test"]["test/bleu"])
    for name, n in (("reversed", len(test_hyps)), ("first15", 15)):
        lines = [x for x in out.splitlines() if x.startswith(f"convseq: test set {name} ")]
        assert lines == [
            f"convseq: test set {name} ({n} sentences): BLEU {sets[name]['bleu']:.2f}, "
            f"chrF {sets[name]['chrf']:.2f}"
        ]

    # task=generate translates an extra set by its name, with the same hypotheses
    out_dir = tmp_path / "gen"
    gen_cfg = generate_config(
        corpus_with_sets,
        out_dir,
        "data=toy",
        SETS,
        f"ckpt={summary['best_checkpoint']}",
        "gen.split=first15",
    )
    run_generate(gen_cfg)
    assert (out_dir / "generate-first15.txt").read_text(encoding="utf-8").splitlines() == head_hyps
    bad = dataclasses.replace(gen_cfg, gen=gen_cfg.gen.updated(split="nosuch"))
    with pytest.raises(DataError, match=r"gen.split='nosuch': this data-bin's scored splits"):
        run_generate(bad)
