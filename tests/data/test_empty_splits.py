"""A split with nothing in it is refused by preprocessing, with its files and counts named.

Single empty lines in valid/test stay (translated as empty); only a file with no text at all, or a
split none of whose pairs survives the filters, is an error. When batching finds no pair within
the model's positions, its error names the data-bin split, its input files and the counts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from convseq.data.batching import TokenBatchSampler
from convseq.data.databin import DataBin
from convseq.data.datamodule import TranslationDataModule
from convseq.data.preprocess import prepare_databin
from convseq.errors import DataError

SPLITS = {
    "train": ("a b\nb c\nc a b\n", "x y\ny\nx x\n"),
    "valid": ("a b\n\n", "x\n\n"),  # an empty line among others is kept
    "test": ("b\n", "y\n"),
    "extra": ("c\n", "x\n"),  # data.test_sets.more
}


def write_corpus(folder: Path, **replace: tuple[str, str]) -> Path:
    """The corpus above with some splits' (source, target) text replaced."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, (src, tgt) in {**SPLITS, **replace}.items():
        (folder / f"{split}.de").write_text(src, encoding="utf-8")
        (folder / f"{split}.en").write_text(tgt, encoding="utf-8")
    return folder


def data_cfg(corpus: Path, **over) -> dict:
    return {
        "name": "empty",
        "dir": str(corpus),
        "src_lang": "de",
        "tgt_lang": "en",
        "subword": {"type": "none"},
        "test_sets": {"more": "extra"},
        **over,
    }


def refused(tmp_path: Path, cfg: dict) -> str:
    """The message of the DataError preprocessing raises; no data-bin may be left behind."""
    cache = tmp_path / "cache"
    with pytest.raises(DataError) as info:
        prepare_databin(cfg, str(cache), progress=False)
    assert not list((cache / "databin").glob("empty-*")), "a data-bin was left behind"
    return str(info.value)


def test_the_corpus_with_an_empty_line_in_valid_builds(tmp_path):
    path = prepare_databin(data_cfg(write_corpus(tmp_path / "c")), str(tmp_path / "cache"), False)
    assert DataBin(path).meta["splits"]["valid"]["sentences"] == 2


@pytest.mark.parametrize(
    "split, src, tgt, key, empty_sides",
    [
        ("valid", "", "", "data.valid_split", ("de", "en")),
        ("valid", "\n  \n\u00a0\t\n", "\n\n\n", "data.valid_split", ("de", "en")),
        ("test", "b\n", " \n", "data.test_split", ("en",)),
        ("test", "", "\n \n", "data.test_split", ("de", "en")),  # no text before line counts
        ("train", "", "", "data.train_split", ("de", "en")),
        ("extra", "\n", "\n", "data.test_sets.more", ("de", "en")),
    ],
)
def test_a_split_without_text_is_refused_naming_its_files(
    tmp_path, split, src, tgt, key, empty_sides
):
    corpus = write_corpus(tmp_path / "c", **{split: (src, tgt)})
    message = refused(tmp_path, data_cfg(corpus))
    for lang in ("de", "en"):
        named = str(corpus / f"{split}.{lang}") in message
        assert named == (lang in empty_sides), (lang, message)
    assert "no text" in message and key in message


def test_train_with_every_pair_dropped_by_the_text_filters_is_refused_with_counts(tmp_path):
    corpus = write_corpus(tmp_path / "c", train=("a b\n\nNOISE\n", "x y\ny\nx\n"))
    message = refused(tmp_path, data_cfg(corpus, drop_train_regex="(a b|NOISE)"))
    assert str(corpus / "train.de") in message and str(corpus / "train.en") in message
    assert "none of the 3 pairs" in message
    assert "2 matching data.drop_train_regex='(a b|NOISE)'" in message
    assert "1 with an empty side" in message


def test_train_with_every_pair_over_long_is_refused_with_counts(tmp_path):
    corpus = write_corpus(tmp_path / "c", train=("a b c\nb c a\n", "x\ny\n"))
    message = refused(tmp_path, data_cfg(corpus, max_positions=3))
    assert "the train split keeps no sentence pair" in message
    assert "none of the 2 pairs" in message
    assert "2 longer than data.max_positions=3" in message
    assert "or change data.max_positions" in message


def test_valid_with_every_line_over_long_and_skipped_is_refused(tmp_path):
    corpus = write_corpus(tmp_path / "c", valid=("a b c\n", "x\n"))
    message = refused(tmp_path, data_cfg(corpus, max_positions=3, eval_overlong="skip"))
    assert "the valid split keeps no sentence pair" in message
    assert str(corpus / "valid.de") in message and "1 longer than" in message


def test_an_empty_epoch_names_the_databin_split_its_files_and_counts(tmp_path):
    corpus = write_corpus(tmp_path / "c")
    dm = TranslationDataModule(
        data_cfg(corpus),
        {"max_tokens": 100},
        str(tmp_path / "cache"),
        max_source_positions=1,  # shorter than any train pair: all are filtered
        max_target_positions=1,
    )
    dm.prepare_data()
    dm.setup()
    with pytest.raises(DataError) as info:
        dm.batch_sampler("train")
    message = str(info.value)
    assert "epoch would be empty" in message and "max_positions (1, 1)" in message
    assert str(dm.databin.path / "train.de-en") in message
    assert str(corpus / "train.de") in message and str(corpus / "train.en") in message
    assert "all 3 of its 3 pairs" in message and "3 input lines" in message


def test_a_split_with_no_pair_says_so():
    empty = np.zeros(0, dtype=np.int64)
    with pytest.raises(DataError, match=r"valid \(from x\): .*the split holds no pair"):
        TokenBatchSampler(empty, empty, max_tokens=10, name="valid", source="from x")
