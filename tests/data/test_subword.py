"""The segmentation a checkpoint carries: written from a Segmenter pair or a data-bin, read back."""

from __future__ import annotations

import pickle

from convseq.data.subword import Segmenter, segmenters, text_processing, train_sentencepiece


def test_a_sentencepiece_segmenter_round_trips_through_its_proto(tmp_path):
    lines = ["ein hund läuft", "eine katze schläft", "der hund schläft"] * 20
    seg = train_sentencepiece(lines, tmp_path / "spm.model", "bpe", vocab_size=30)
    proto = seg.to_proto()
    assert isinstance(proto, bytes) and proto
    again = Segmenter.from_proto(proto)
    assert again.segment("ein hund schläft") == seg.segment("ein hund schläft")
    assert pickle.loads(pickle.dumps(seg)).segment("eine katze") == seg.segment("eine katze")
    entry = text_processing("de", "en", seg, Segmenter(None))
    assert entry == {"src_lang": "de", "tgt_lang": "en", "src_spm": proto, "tgt_spm": None}
    src, tgt = segmenters(entry)
    assert src.segment("der hund läuft") == seg.segment("der hund läuft")
    assert tgt.model is None and tgt.segment("a  b") == ["a", "b"]


def test_whitespace_segmenters_have_no_proto():
    assert Segmenter(None).to_proto() is None
    assert Segmenter.from_proto(None).model is None
    assert all(s.model is None for s in segmenters(None))
