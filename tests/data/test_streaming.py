"""The streaming pieces of preprocessing: block reader, .npy writer, block encoder, sampling."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest

from convseq.data.encode import SymbolTable, encode_block
from convseq.data.indexed import NpyWriter
from convseq.data.subword import (
    Segmenter,
    sample_sentences,
    train_sentencepiece,
)
from convseq.data.textio import (
    PairFilter,
    TextStream,
    iter_pairs,
    read_text_file,
    scan_text_file,
)
from convseq.errors import DataError


def write(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def reference_lines(data: bytes) -> list[str]:
    """The lines of a well-formed file, the simple way: decode it whole and split on \\n."""
    text = data.decode("utf-8").removeprefix("\ufeff").replace("\r\n", "\n")
    lines = text.split("\n")
    if not text or text.endswith("\n"):
        lines.pop()
    return [ln.strip() for ln in lines]


# -- the block reader ----------------------------------------------------------------------------
@pytest.mark.parametrize("block", [1, 2, 3, 7, 64, 1 << 20])
def test_blocks_of_any_size_give_the_same_lines(tmp_path, block):
    rng = random.Random(block)
    words = ["a", "bb", "ß", "\u00a0x\u00a0", "€uro", "", " ", "日本"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 6))) for _ in range(300)]
    for ending, bom, final in (("\n", False, True), ("\r\n", True, False), ("\n", True, False)):
        data = (("\ufeff" if bom else "") + ending.join(lines) + (ending if final else "")).encode()
        path = write(tmp_path, "a.de", data)
        stream = TextStream(path, block_bytes=block)
        got = [ln for blk in stream for ln in blk]
        assert got == reference_lines(data)
        info = stream.info
        assert info.num_lines == len(got) and info.num_bytes == len(data)
        assert info.newlines == data.count(b"\n") and info.crlf == (ending == "\r\n")
        assert scan_text_file(path, block_bytes=block) == info
        assert read_text_file(path).lines == got


@pytest.mark.parametrize("block", [1, 5, 1 << 20])
def test_utf8_error_line_is_exact_in_a_later_block(tmp_path, block):
    data = b"".join(b"line %d\n" % i for i in range(40)) + b"bad \xe4 byte\n" + b"ok\n"
    path = write(tmp_path, "a.de", data)
    with pytest.raises(DataError) as info:
        scan_text_file(path, block_bytes=block)
    assert info.value.line == 41
    assert str(info.value).startswith(f"{path}:41: not valid UTF-8 (byte 0xe4")


def test_utf8_error_anywhere_wins_over_an_earlier_carriage_return(tmp_path):
    # Decoding the whole file first reported the bad byte even when a stray \r came earlier.
    data = b"a\rb\n" + b"x\n" * 50 + b"\xff\n"
    path = write(tmp_path, "a.de", data)
    with pytest.raises(DataError, match="not valid UTF-8") as info:
        scan_text_file(path, block_bytes=8)
    assert info.value.line == 52
    path = write(tmp_path, "b.de", b"x\n" * 50 + b"a\rb\n" + b"y\n")
    with pytest.raises(DataError, match="carriage return") as info:
        scan_text_file(path, block_bytes=8)
    assert info.value.line == 51


def test_a_changed_file_is_detected(tmp_path):
    path = write(tmp_path, "a.de", b"one\ntwo\n")
    sha = scan_text_file(path).sha256
    path.write_bytes(b"one\nTWO\n")
    with pytest.raises(DataError, match="changed while preprocessing"):
        list(TextStream(path, expect_sha256=sha))


def test_iter_pairs_blocks_and_alignment(tmp_path):
    src = write(tmp_path, "t.de", "".join(f"s{i}\n" for i in range(23)).encode())
    tgt = write(tmp_path, "t.en", "".join(f" t{i} \r\n" for i in range(23)).encode())
    blocks = list(iter_pairs(src, tgt, 5))
    assert [first for first, _, _ in blocks] == [0, 5, 10, 15, 20]
    assert [ln for _, s, _ in blocks for ln in s] == [f"s{i}" for i in range(23)]
    assert [ln for _, _, t in blocks for ln in t] == [f"t{i}" for i in range(23)]
    tgt.write_bytes(b"x\n")  # shorter than when it was checked
    with pytest.raises(DataError, match="changed while preprocessing"):
        list(iter_pairs(src, tgt, 5))


def test_block_filters_match_the_whole_file_filters(tmp_path):
    src_lines = ["a", "", "b", "@@", "c c c c", "d"]
    tgt_lines = ["x", "y", "", "z", "w", "v v v v v"]
    whole = PairFilter(is_train=True, max_positions=4, drop_regex="@@")
    blocks = PairFilter(is_train=True, max_positions=4, drop_regex="@@")
    mask = np.concatenate(
        [blocks.text_mask(i, src_lines[i : i + 4], tgt_lines[i : i + 4], "s", "t") for i in (0, 4)]
    )
    src_tf = read_text_file(write(tmp_path, "s", "\n".join(src_lines).encode() + b"\n"))
    tgt_tf = read_text_file(write(tmp_path, "t", "\n".join(tgt_lines).encode() + b"\n"))
    assert np.flatnonzero(mask).tolist() == whole.keep_text(src_tf, tgt_tf) == [0, 4, 5]
    lens_s, lens_t = [1, 4, 1], [1, 1, 5]
    keep = blocks.length_mask(np.array([0, 4, 5]), lens_s, lens_t, "s", "t")
    assert keep.tolist() == [True, False, False]
    assert whole.keep_lengths([0, 4, 5], lens_s, lens_t, src_tf, tgt_tf) == [0]
    assert whole.skipped == blocks.skipped == {"empty": 2, "drop_train_regex": 1, "too_long": 2}


# -- the .npy writer -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64])
@pytest.mark.parametrize("n", [0, 1, 10, 1000, 70000])
def test_npy_writer_writes_the_bytes_of_np_save(tmp_path, dtype, n):
    values = np.random.RandomState(n).randint(0, 60000, size=n).astype(dtype)
    expected = io.BytesIO()
    np.save(expected, values)
    path = tmp_path / "a.npy"
    with NpyWriter(path, dtype, n) as w:
        for start in range(0, n, 333):
            w.write(values[start : start + 333].astype(np.int64))  # converted on the way
    assert path.read_bytes() == expected.getvalue()
    assert not (tmp_path / "a.npy.tmp").exists()


def test_npy_writer_refuses_a_wrong_length_and_leaves_nothing(tmp_path):
    path = tmp_path / "a.npy"
    with pytest.raises(ValueError, match="2 values written, 3 announced"):
        with NpyWriter(path, np.int32, 3) as w:
            w.write(np.array([1, 2]))
    with pytest.raises(ValueError, match="more than the 1 values"):
        with NpyWriter(path, np.int32, 1) as w:
            w.write(np.array([1, 2]))
    assert list(tmp_path.iterdir()) == []


# -- the block encoder ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spm_segmenter(tmp_path_factory):
    rng = random.Random(3)
    words = ["haus", "hund", "katze", "baum", "grün", "läuft", "schön", "straße"]
    train = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 7))) for _ in range(400)]
    path = tmp_path_factory.mktemp("spm") / "spm.model"
    return train_sentencepiece(train, path, "bpe", vocab_size=60)


def decoded(table: SymbolTable, enc, ids: np.ndarray | None = None) -> list[list[str]]:
    ids = table.globalize(enc) if ids is None else ids
    out, start = [], 0
    for n in enc.lengths:
        out.append([table.symbols[i] for i in ids[start : start + n]])
        start += n
    return out


@pytest.mark.parametrize("kind", ["words", "sentencepiece"])
def test_encode_block_gives_the_tokens_of_segment_many(spm_segmenter, kind):
    seg = Segmenter(None) if kind == "words" else spm_segmenter
    n_pieces = seg.model.get_piece_size() if seg.model else 0
    pieces = [seg.model.id_to_piece(i) for i in range(n_pieces)]
    table = SymbolTable(pieces)
    # Unseen characters ("ж", "Q", "ø") come out of sentencepiece as its unknown piece.
    blocks = [
        ["haus hund", "", "katze läuft schön"],
        ["жж haus Q", "grün straße", "ø"],
        ["haus жж", "<unk> </s>"],
    ]
    for lines in blocks:
        enc = encode_block(seg, lines)
        assert enc.lengths.tolist() == [len(t) for t in seg.segment_many(lines)]
        assert decoded(table, enc) == seg.segment_many(lines)
    if seg.model is not None:
        assert "ж" in "".join(table.symbols[len(pieces) :])


def test_symbol_table_counts_only_what_it_is_given():
    table = SymbolTable()
    enc = encode_block(Segmenter(None), ["a b a", "c"])
    ids = table.globalize(enc)
    table.count(ids[:3])  # the first sentence only
    enc2 = encode_block(Segmenter(None), ["c d"] * 700)
    table.count(table.globalize(enc2))
    assert table.counted() == {"a": 2, "b": 1, "c": 700, "d": 700}
    lut = table.lookup_table({"a": 4, "c": 5}, unk=3, dtype=np.uint16)
    assert lut.tolist() == [4, 3, 5, 3] and lut.dtype == np.uint16


# -- sampling for sentencepiece ------------------------------------------------------------------
def test_sample_is_exact_ordered_seeded_and_spread(monkeypatch):
    import convseq.data.subword as sw

    monkeypatch.setattr(sw, "SAMPLE_BLOCK", 1000)  # many blocks
    items = [str(i) for i in range(10_000)]
    a = list(sample_sentences(iter(items), len(items), 2500, seed=1))
    assert len(a) == 2500 and len(set(a)) == 2500
    assert [int(x) for x in a] == sorted(int(x) for x in a)  # input order
    assert a == list(sample_sentences(items, len(items), 2500, seed=1))
    assert a != list(sample_sentences(items, len(items), 2500, seed=2))
    per_block = np.bincount([int(x) // 1000 for x in a], minlength=10)
    assert per_block.min() > 180 and per_block.max() < 320  # about 250 from every block
    assert list(sample_sentences(items, len(items), 20_000)) == items  # size above the count


def test_sentencepiece_on_a_sample_is_deterministic(tmp_path):
    rng = random.Random(5)
    syllables = ["ka", "to", "mi", "ré", "su", "lo", "pa", "ne", "qu", "zi"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(300)]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(3000)]

    def train(name: str, size: int) -> bytes:
        train_sentencepiece(
            iter(lines),
            tmp_path / name,
            "unigram",
            200,
            input_sentence_size=size,
            num_sentences=len(lines),
        )
        return (tmp_path / name).read_bytes()

    sampled = train("a.model", 500)
    assert train("b.model", 500) == sampled  # sentencepiece's own shuffle differs every run
    assert train("c.model", 0) != sampled
    assert train("d.model", 5000) != train("e.model", 0)  # the size is recorded in the model
    with pytest.raises(ValueError, match="num_sentences"):
        train_sentencepiece(iter(lines), tmp_path / "f.model", "bpe", 50, input_sentence_size=9)
