"""Both kinds of data-bin implement `BaseDataBin`: convseq's own and a fairseq-preprocess folder
of the same corpus answer its questions (sizes, splits held, kept text) without a caller asking
which kind it holds."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from convseq.data.base_databin import BaseDataBin
from convseq.data.databin import DataBin
from convseq.data.fairseq_databin import FairseqDataBin
from convseq.data.preprocess import prepare_databin
from tests.data.fairseq_layout import fairseq_copy

LINES = {"train": 9, "valid": 4, "test": 3}  # sentence pairs written per split, all kept
SRC_WORDS, TGT_WORDS = ["a", "b", "c", "d"], ["w", "x", "y", "z"]


def write_corpus(folder: Path) -> Path:
    """`{split}.de` / `{split}.en` with LINES[split] short, valid pairs each."""
    folder.mkdir(parents=True)
    for split, n in LINES.items():
        for lang, words in (("de", SRC_WORDS), ("en", TGT_WORDS)):
            lines = [" ".join(words[(i + k) % 4] for k in range(1 + i % 3)) for i in range(n)]
            (folder / f"{split}.{lang}").write_text("".join(f"{line}\n" for line in lines))
    return folder


@pytest.fixture(scope="module")
def databins(tmp_path_factory) -> tuple[DataBin, FairseqDataBin, FairseqDataBin]:
    """convseq's data-bin of the corpus, its fairseq copy, and a fairseq copy without test."""
    root = tmp_path_factory.mktemp("interface")
    cfg = {"name": "tiny", "dir": str(write_corpus(root / "corpus")), "src_lang": "de",
           "tgt_lang": "en", "subword": {"type": "none"}, "vocab": {"joined": False}}  # fmt: skip
    databin = DataBin(prepare_databin(cfg, str(root / "cache"), progress=False))
    full = FairseqDataBin(fairseq_copy(databin, root / "fairseq"))
    partial = FairseqDataBin(fairseq_copy(databin, root / "partial", ("train", "valid")))
    return databin, full, partial


def test_the_interface_is_abstract_and_both_kinds_implement_every_abstract_member():
    abstract = BaseDataBin.__abstractmethods__
    assert {"split", "text", "has_split", "sizes", "keeps_text", "test_sets"} <= abstract
    with pytest.raises(TypeError):
        BaseDataBin()  # type: ignore[abstract]
    for cls in (DataBin, FairseqDataBin):
        assert issubclass(cls, BaseDataBin) and not cls.__abstractmethods__
        for name in abstract:  # each defined by the class itself, not inherited
            assert getattr(cls, name) is not getattr(BaseDataBin, name), (cls, name)


def test_sizes_give_the_pair_and_the_sentences_of_the_corpus(databins):
    for db in databins[:2]:
        sizes = db.sizes()
        assert (sizes["src_lang"], sizes["tgt_lang"]) == ("de", "en")
        got = {role: sizes["splits"][role]["sentences"] for role in LINES}
        assert got == LINES, db


def test_a_split_the_folder_lacks_is_known_and_left_out_of_the_sizes(databins):
    databin, full, partial = databins
    for db in (databin, full):
        assert all(db.has_split(role) for role in LINES) and not db.has_split("test7")
    assert partial.has_split("valid") and not partial.has_split("test")
    assert partial.sizes()["splits"] == {"train": {"sentences": 9}, "valid": {"sentences": 4}}


def test_what_differs_is_asked_not_told_apart_by_class(databins):
    databin, full, _ = databins
    assert databin.keeps_text and not full.keeps_text
    for db in (databin, full):  # the shared code answers alike for both kinds
        assert db.scored_splits() == ["valid", "test"] and db.lang("tgt") == "en"
        assert db.dictionary("src") == databin.src_dict
        assert db.text("valid") == databin.text("valid")  # no unknown words in this corpus
        assert db.decode(db.split("test")[1][0]) == databin.text("test")[0]
        assert db.text_processing()["src_spm"] is None
        assert repr(db) == f"{type(db).__name__}({str(db.path)!r}, de->en)"
        copy = pickle.loads(pickle.dumps(db))  # memory maps are not pickled, but reopened
        assert copy._splits == {} and len(copy.split("train")[0]) == LINES["train"]
