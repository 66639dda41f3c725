"""Preprocessing makes, byte for byte, the data-bins pinned in `fixtures/databin_sha256.json`.

The fixture was recorded from the code of the commit it names (before preprocessing streamed its
input), so these checks hold any rewrite of preprocessing to the bytes that data-bins already in
use were made of: dictionaries, sentencepiece models, token arrays, line indices and reference
text, and the data-bin key (its folder name).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from convseq.data.preprocess import prepare_databin
from tests.data.reference_corpora import (
    REFERENCE_CORPORA,
    why_pins_do_not_apply,
    write_reference_corpus,
)

FIXTURE = json.loads(
    (Path(__file__).parent / "fixtures" / "databin_sha256.json").read_text(encoding="utf-8")
)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", REFERENCE_CORPORA)
def test_databin_bytes_match_the_pinned_ones(tmp_path, name):
    reason = why_pins_do_not_apply(name, FIXTURE)
    if reason:
        pytest.skip(reason)
    want = FIXTURE["databins"][name]
    corpus = tmp_path / "corpus"
    cfg = write_reference_corpus(name, corpus)
    # The inputs first: a failure here means the frozen generator changed, not preprocessing.
    for input_name, info in want["meta"]["inputs"].items():
        assert _sha256(corpus / input_name) == info["sha256"], input_name
    path = prepare_databin(cfg, str(tmp_path / "cache"), progress=False)
    assert path.name.endswith(want["meta"]["key"][:12])
    got = {p.name: _sha256(p) for p in sorted(path.iterdir()) if p.name != "meta.json"}
    assert got == want["files"]
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    for key in ("key", "splits", "vocab", "settings"):
        assert meta[key] == want["meta"][key], key


def test_the_subword_pins_apply_only_with_the_sentencepiece_that_recorded_them():
    import sentencepiece

    other = {**FIXTURE, "versions": {**FIXTURE["versions"], "sentencepiece": "0.0.1"}}
    assert why_pins_do_not_apply("toy-words", other) is None  # no subword model: any version
    reason = why_pins_do_not_apply("synthetic-unigram-separate", other)
    assert reason is not None and "0.0.1" in reason and sentencepiece.__version__ in reason
    same = sentencepiece.__version__ == FIXTURE["versions"]["sentencepiece"]
    assert (why_pins_do_not_apply("synthetic-bpe-joint", FIXTURE) is None) == same
