"""Dictionary: fairseq's dict.txt format, finalize rules (threshold, nwords, padding to 8)."""

from __future__ import annotations

import numpy as np
import pytest

from convseq.data.dictionary import Dictionary
from convseq.errors import DataError

# Counts: c 3, a 2, b 2, d 1, e 1 (ties ordered alphabetically, as fairseq's finalize does).
LINES = ["a b c", "c c a", "b d e"]
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]


def test_build_orders_by_count_then_alphabet_and_pads_to_8():
    d = Dictionary.build(LINES)
    assert d.symbols[:4] == SPECIALS
    assert (d.bos(), d.pad(), d.eos(), d.unk()) == (0, 1, 2, 3)
    pads = [f"madeupword{i:04d}" for i in range(7)]
    assert d.symbols[4:] == ["c", "a", "b", "d", "e", *pads]
    assert len(d) == 16
    assert d.count[4:9] == [3, 2, 2, 1, 1]


def test_threshold_and_nwords():
    d = Dictionary.build(LINES, threshold=2)
    assert d.symbols[4:] == ["c", "a", "b", "madeupword0000"]  # d, e seen once: dropped
    d = Dictionary.build(LINES, nwords=6)  # nwords counts the 4 specials
    assert d.symbols[4:] == ["c", "a", "madeupword0000", "madeupword0001"]
    d = Dictionary.build(LINES, padding_factor=1)
    assert len(d) == 9
    assert d.index("e") == 8 and d.index("zzz") == d.unk()


def test_save_writes_fairseq_dict_txt(tmp_path):
    d = Dictionary.build(LINES, threshold=2)
    path = tmp_path / "dict.de.txt"
    d.save(path)
    assert path.read_text(encoding="utf-8") == "c 3\na 2\nb 2\nmadeupword0000 0\n"
    again = Dictionary.load(path)
    assert again == d
    assert again.count == d.count


def test_load_fairseq_written_file(tmp_path):
    # As fairseq-preprocess writes it: specials implicit, first symbol gets id 4.
    path = tmp_path / "dict.en.txt"
    path.write_text("the 10\n, 7\nHaus 3\n<unk> 0 #fairseq:overwrite\n", encoding="utf-8")
    d = Dictionary.load(path)
    # the flagged repeat of <unk> takes id 7, as fairseq's add_from_file gives it
    assert d.symbols == [*SPECIALS, "the", ",", "Haus", "<unk>"]
    assert d.count[4:] == [10, 7, 3, 0] and d.index("<unk>") == 7 and d.unk() == 3
    np.testing.assert_array_equal(d.encode_line("the Haus ist"), [4, 6, 3, 2])
    assert d.string([4, 5, 6, 2, 1, 1]) == "the , Haus"


def test_symbol_with_spaces_round_trips(tmp_path):
    # fairseq splits each line at its last space: a symbol may itself contain spaces.
    path = tmp_path / "dict.txt"
    path.write_text("a b 4\n", encoding="utf-8")
    d = Dictionary.load(path)
    assert d.symbols[4] == "a b"
    d.save(path)
    assert path.read_text(encoding="utf-8") == "a b 4\n"


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("the 10\nhello\n", 2, "malformed line"),
        ("the 10\n, 7\nHaus three\n", 3, "malformed line"),
        ("the 10\n\nx 1\n", 2, "empty line"),
        ("the 10\nthe 4\n", 2, "duplicate symbol"),
    ],
)
def test_malformed_file_names_file_and_line(tmp_path, text, line, words):
    path = tmp_path / "dict.de.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError) as info:
        Dictionary.load(path)
    assert info.value.line == line
    assert f"{path}:{line}:" in str(info.value)
    assert words in str(info.value)


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="dictionary file not found"):
        Dictionary.load(tmp_path / "nope.txt")


def test_to_list_from_list_round_trip():
    d = Dictionary.build(LINES)
    again = Dictionary.from_list(d.to_list())
    assert again == d
    with pytest.raises(DataError, match="must start with"):
        Dictionary.from_list(["a", "b", "c", "d"])
