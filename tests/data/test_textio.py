"""Reading and checking text: each bad input gives an error naming its file and line."""

from __future__ import annotations

import hashlib

import pytest

from convseq.data.textio import (
    PairFilter,
    TextFile,
    check_same_length,
    file_sha256,
    read_text_file,
)
from convseq.errors import DataError


def write(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_missing_file(tmp_path):
    with pytest.raises(DataError) as info:
        read_text_file(tmp_path / "train.de")
    assert f"{tmp_path / 'train.de'}: " in str(info.value)
    assert "not found" in str(info.value)
    with pytest.raises(DataError, match="not found"):
        file_sha256(tmp_path / "train.de")


def test_invalid_utf8_reports_line(tmp_path):
    path = write(tmp_path, "train.de", b"gut\nauch gut\nschlecht \xe4 hier\nok\n")
    with pytest.raises(DataError) as info:
        read_text_file(path)
    assert info.value.line == 3
    assert str(info.value).startswith(f"{path}:3: not valid UTF-8 (byte 0xe4")


def test_crlf_is_normalised(tmp_path):
    path = write(tmp_path, "a.en", b"one two\r\nthree\r\n")
    tf = read_text_file(path)
    assert tf.lines == ["one two", "three"]
    assert tf.crlf is True
    assert tf.sha256 == hashlib.sha256(b"one two\r\nthree\r\n").hexdigest()
    assert tf.sha256 == file_sha256(path)


@pytest.mark.parametrize(
    "data, line", [(b"a\rb\nc\n", 1), (b"x\r\ny\rz\r\nw\r\n", 2), (b"x\ny\nlast\r", 3)]
)
def test_stray_carriage_return_reported(tmp_path, data, line):
    path = write(tmp_path, "a.en", data)
    with pytest.raises(DataError) as info:
        read_text_file(path)
    assert info.value.line == line
    assert f"{path}:{line}: carriage return" in str(info.value)


def test_strip_bom_final_newline_and_unicode_separators(tmp_path):
    data = "\ufeff  Nummer\u00a028 \u00a0\nform\x0cfeed\n\nlast".encode()
    tf = read_text_file(write(tmp_path, "a.de", data))
    # Only \n splits lines; NBSP at the ends is stripped, inside it stays.
    assert tf.lines == ["Nummer\u00a028", "form\x0cfeed", "", "last"]
    assert read_text_file(write(tmp_path, "e.de", b"")).lines == []
    assert read_text_file(write(tmp_path, "n.de", b"\n")).lines == [""]


def test_line_counts_differ_names_both(tmp_path):
    src = read_text_file(write(tmp_path, "train.de", b"a\nb\nc\n"))
    tgt = read_text_file(write(tmp_path, "train.en", b"a\nb\n"))
    with pytest.raises(DataError) as info:
        check_same_length(src, tgt)
    msg = str(info.value)
    assert f"{src.path} has 3 lines" in msg and f"{tgt.path} has 2 lines" in msg


def tf(name: str, lines: list[str]) -> TextFile:
    return TextFile(path=name, lines=lines, sha256="", num_bytes=0)


def test_train_empty_pairs_skipped_and_counted():
    src = tf("train.de", ["a", "", "b", "@@", "c"])
    tgt = tf("train.en", ["x", "y", "", "z", "w"])
    f = PairFilter(is_train=True, max_positions=10, drop_regex="@@")
    assert f.keep_text(src, tgt) == [0, 4]
    assert dict(f.skipped) == {"empty": 2, "drop_train_regex": 1}


def test_regex_must_match_the_whole_line():
    src = tf("train.de", ["a @@ b", "@@"])
    tgt = tf("train.en", ["x", "y"])
    f = PairFilter(is_train=True, max_positions=10, drop_regex="@@")
    assert f.keep_text(src, tgt) == [0]


def test_train_empty_pair_error_policy_names_file_and_line():
    src = tf("train.de", ["a", "b", "c"])
    tgt = tf("train.en", ["x", "y", " "[:0]])
    f = PairFilter(is_train=True, max_positions=10, train_invalid="error")
    with pytest.raises(DataError) as info:
        f.keep_text(src, tgt)
    assert str(info.value).startswith("train.en:3: empty line")
    assert "data.train_invalid=skip" in str(info.value)


def test_eval_keeps_empty_lines():
    src = tf("test.de", ["", "a"])
    tgt = tf("test.en", ["x", ""])
    f = PairFilter(is_train=False, max_positions=10, drop_regex="x")
    assert f.keep_text(src, tgt) == [0, 1]
    assert not f.skipped


def test_overlong_train_skip_and_error():
    src, tgt = tf("train.de", ["a"] * 4), tf("train.en", ["b"] * 4)
    indices = [0, 2, 3]  # line 2 was dropped earlier
    f = PairFilter(is_train=True, max_positions=4)  # 3 tokens + EOS fit
    assert f.keep_lengths(indices, [3, 4, 1], [1, 1, 3], src, tgt) == [0, 2]
    assert dict(f.skipped) == {"too_long": 1}
    f = PairFilter(is_train=True, max_positions=4, train_invalid="error")
    with pytest.raises(DataError) as info:
        f.keep_lengths(indices, [3, 1, 1], [1, 1, 4], src, tgt)
    assert str(info.value).startswith("train.en:4: sentence of 5 tokens")
    assert "max_positions=4" in str(info.value)


def test_overlong_eval_error_unless_skip():
    src, tgt = tf("valid.de", ["a"] * 3), tf("valid.en", ["b"] * 3)
    f = PairFilter(is_train=False, max_positions=3)
    with pytest.raises(DataError) as info:
        f.keep_lengths([0, 1, 2], [1, 3, 1], [1, 1, 1], src, tgt)
    assert str(info.value).startswith("valid.de:2: sentence of 4 tokens")
    assert "data.eval_overlong=skip" in str(info.value)
    f = PairFilter(is_train=False, max_positions=3, eval_overlong="skip")
    assert f.keep_lengths([0, 1, 2], [1, 3, 1], [1, 1, 1], src, tgt) == [0, 2]
    assert dict(f.skipped) == {"too_long": 1}


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"train_invalid": "drop"}, "data.train_invalid"),
        ({"eval_overlong": "keep"}, "data.eval_overlong"),
        ({"max_positions": 1}, "data.max_positions"),
        ({"drop_regex": "(("}, "data.drop_train_regex"),
    ],
)
def test_bad_policy_values(kwargs, words):
    args = {"is_train": True, "max_positions": 8, **kwargs}
    with pytest.raises(DataError, match=words):
        PairFilter(**args)
