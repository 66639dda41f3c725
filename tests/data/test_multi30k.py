"""Preprocess the real Multi30k corpus (<data root>/multi30k: $CONVSEQ_DATA_ROOT, else
../shared/data) and check it against its README.

The README gives 29,000 / 1,014 / 1,000 pairs; conf/data/multi30k.yaml drops the two train pairs
whose German side is only "@@" (train.de lines 16510 and 16664), so train keeps 28,998.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from convseq.data.databin import DataBin
from convseq.data.preprocess import ensure_databin
from tests.conftest import missing_multi30k, multi30k_dir

CORPUS = multi30k_dir()
CONF = Path(__file__).resolve().parents[2] / "conf" / "data" / "multi30k.yaml"

pytestmark = pytest.mark.skipif(missing_multi30k() is not None, reason=missing_multi30k() or "")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cfg = OmegaConf.load(CONF)
    cfg.dir = str(CORPUS)  # the YAML reads ${paths.data_root}/multi30k
    cache = tmp_path_factory.mktemp("cache")
    path, was_built = ensure_databin(cfg, str(cache), progress=False)
    return path, was_built, cfg, cache


def test_counts_match_the_readme(built):
    path, was_built, _, _ = built
    assert was_built
    db = DataBin(path)
    meta = db.meta
    assert meta["subword"]["type"] == "bpe" and meta["subword"]["joint"] is True
    train = meta["splits"]["train"]
    assert train["input_lines"] == 29_000
    assert train["sentences"] == 28_998
    assert train["skipped"] == {"drop_train_regex": 2}
    assert meta["splits"]["valid"]["sentences"] == 1_014
    assert meta["splits"]["test"]["sentences"] == 1_000
    assert meta["splits"]["valid"]["skipped"] == meta["splits"]["test"]["skipped"] == {}
    lines = db.lines("train")
    assert len(lines) == 28_998
    assert 16_509 not in lines and 16_663 not in lines  # 0-based: README lines 16510, 16664
    for split, n in (("train", 28_998), ("valid", 1_014), ("test", 1_000)):
        src, tgt = db.split(split)
        assert len(src) == len(tgt) == n
    # README checksums of the inputs.
    assert (
        meta["inputs"]["test.en"]["sha256"]
        == "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182"
    )


def test_joined_dictionary_and_low_unk(built):
    path, _, _, _ = built
    db = DataBin(path)
    assert (path / "dict.de.txt").read_bytes() == (path / "dict.en.txt").read_bytes()
    assert len(db.src_dict) % 8 == 0 and len(db.src_dict) <= 8000 + 8
    for split in ("train", "valid", "test"):
        for side in ("src", "tgt"):
            assert db.meta["splits"][split][side]["unk_rate"] < 0.001
    assert db.meta["splits"]["train"]["src"]["unk"] == 0  # trained on train: full coverage


def test_decode_gives_back_the_raw_text(built):
    path, _, _, _ = built
    db = DataBin(path)
    raw_de = (CORPUS / "test.de").read_text(encoding="utf-8").split("\n")[:1000]
    raw_en = (CORPUS / "test.en").read_text(encoding="utf-8").split("\n")[:1000]
    src, tgt = db.split("test")
    for i in (0, 1, 500, 999):
        assert db.decode(tgt[i], "tgt") == raw_en[i].strip()
        assert db.decode(src[i], "src") == raw_de[i].strip()
        np.testing.assert_array_equal(db.encode(raw_de[i], "src"), src[i])
    assert db.text("test", "tgt") == [line.strip() for line in raw_en]


def test_second_run_reuses(built):
    path, _, cfg, cache = built
    assert ensure_databin(cfg, str(cache), progress=False) == (path, False)
