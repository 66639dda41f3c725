"""fairseq dictionaries given as `data.src_dict` / `data.tgt_dict` are used exactly as written.

The dictionaries here are written by hand: their symbols are out of count order and their sizes
no multiple of 8, so any sorting, thresholding or padding by preprocessing would show.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from convseq.common.specials import SPECIAL_SYMBOLS
from convseq.data.databin import DataBin
from convseq.data.dictionary import Dictionary
from convseq.data.preprocess import prepare_databin
from convseq.errors import DataError
from tests.training_utils import tiny_config

CORPUS = {
    "train": ("a b c\nb a\nd b\n", "x y\ny z\nx\n"),
    "valid": ("a d\n", "y\n"),
    "test": ("b\n", "z x\n"),
}
SRC_DICT = "b 9\nzz 4\na 5\n"  # c and d are missing: they become <unk>
JOINT_DICT = "b 9\nzz 4\na 5\nx 2\n"  # y and z are missing on the target side
UNK, EOS = 3, 2


def write_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, (src, tgt) in CORPUS.items():
        (folder / f"{split}.de").write_text(src, encoding="utf-8")
        (folder / f"{split}.en").write_text(tgt, encoding="utf-8")
    return folder


def write_dict(path: Path, text: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return str(path)


def data_cfg(corpus: Path, joined: bool = False, **over) -> dict:
    return {
        "name": "given",
        "dir": str(corpus),
        "src_lang": "de",
        "tgt_lang": "en",
        "subword": {"type": "none"},
        "vocab": {"joined": joined},
        **over,
    }


def rows(text: str) -> list[tuple[str, int]]:
    """(symbol, count) of each line of a hand-written dict.txt."""
    return [(s, int(c)) for s, c in (line.rsplit(" ", 1) for line in text.splitlines())]


def ids(databin: DataBin, split: str, side: int) -> list[list[int]]:
    arrays = databin.split(split)[side]
    return [arrays[i].tolist() for i in range(len(arrays))]


def test_a_given_source_dictionary_is_kept_as_written(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    given = write_dict(tmp_path / "dicts" / "dict.de.txt", SRC_DICT)
    path = prepare_databin(data_cfg(corpus, src_dict=given), str(tmp_path / "cache"), False)
    db = DataBin(path)
    assert (path / "dict.de.txt").read_text(encoding="utf-8") == SRC_DICT
    d = db.src_dict
    assert d.symbols == [*SPECIAL_SYMBOLS, "b", "zz", "a"]  # file order, no padding
    assert list(zip(d.symbols[4:], d.count[4:])) == rows(SRC_DICT)
    b, a = d.index("b"), d.index("a")
    assert ids(db, "train", 0) == [[a, b, UNK, EOS], [b, a, EOS], [UNK, b, EOS]]
    assert ids(db, "valid", 0) == [[a, UNK, EOS]]
    # the target side has no given dictionary: built from its train counts, padded as before
    assert db.tgt_dict.symbols == Dictionary.build(CORPUS["train"][1].splitlines()).symbols
    assert db.meta["vocab"]["given"] == {
        "src": {"path": given, "sha256": db.meta["vocab"]["given"]["src"]["sha256"]}
    }
    assert db.meta["splits"]["train"]["src"]["unk_rate"] > 0


def test_a_given_target_dictionary_alone(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    given = write_dict(tmp_path / "dict.en.txt", "z 1\ny 7\n")
    path = prepare_databin(data_cfg(corpus, tgt_dict=given), str(tmp_path / "cache"), False)
    db = DataBin(path)
    assert (path / "dict.en.txt").read_text(encoding="utf-8") == "z 1\ny 7\n"
    z, y = db.tgt_dict.index("z"), db.tgt_dict.index("y")
    assert (z, y) == (4, 5)
    assert ids(db, "train", 1) == [[UNK, y, EOS], [y, z, EOS], [UNK, EOS]]
    assert len(db.src_dict) % 8 == 0  # the built side keeps its padding


def test_a_joined_given_dictionary_serves_both_sides(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    given = write_dict(tmp_path / "dict.txt", JOINT_DICT)
    cache = str(tmp_path / "cache")
    path = prepare_databin(data_cfg(corpus, joined=True, src_dict=given), cache, False)
    db = DataBin(path)
    for lang in ("de", "en"):
        assert (path / f"dict.{lang}.txt").read_text(encoding="utf-8") == JOINT_DICT
    assert db.src_dict == db.tgt_dict and len(db.tgt_dict) == 8
    x = db.tgt_dict.index("x")
    assert ids(db, "train", 1) == [[x, UNK, EOS], [UNK, UNK, EOS], [x, EOS]]
    # naming the same file on both sides is the same dictionary, hence the same data-bin
    both = data_cfg(corpus, joined=True, src_dict=given, tgt_dict=given)
    assert prepare_databin(both, cache, False) == path


def test_joined_with_two_different_files_is_refused(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    src = write_dict(tmp_path / "dict.de.txt", SRC_DICT)
    tgt = write_dict(tmp_path / "dict.en.txt", "x 1\n")
    cfg = data_cfg(corpus, joined=True, src_dict=src, tgt_dict=tgt)
    with pytest.raises(DataError, match="data.vocab.joined=true uses one dictionary") as info:
        prepare_databin(cfg, str(tmp_path / "cache"), False)
    assert src in str(info.value) and tgt in str(info.value)


def test_the_dictionary_content_is_part_of_the_databin_key(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    cache = str(tmp_path / "cache")
    plain = prepare_databin(data_cfg(corpus), cache, False)
    unset = prepare_databin(data_cfg(corpus, src_dict=None, tgt_dict=None), cache, False)
    assert unset == plain and "given" not in json.loads((plain / "meta.json").read_text())["vocab"]
    given = write_dict(tmp_path / "dict.de.txt", SRC_DICT)
    first = prepare_databin(data_cfg(corpus, src_dict=given), cache, False)
    moved = write_dict(tmp_path / "elsewhere" / "dict.de.txt", SRC_DICT)
    assert prepare_databin(data_cfg(corpus, src_dict=moved), cache, False) == first
    write_dict(tmp_path / "dict.de.txt", SRC_DICT + "c 1\n")
    second = prepare_databin(data_cfg(corpus, src_dict=given), cache, False)
    assert len({plain, first, second}) == 3
    assert DataBin(second).src_dict.index("c") == 7


def test_the_fairseq_overwrite_flag_gives_a_repeat_its_own_id(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    text = "b 9\na 5\n<unk> 0 #fairseq:overwrite\nb 2 #fairseq:overwrite\n"
    given = write_dict(tmp_path / "dict.de.txt", text)
    path = prepare_databin(data_cfg(corpus, src_dict=given), str(tmp_path / "cache"), False)
    db = DataBin(path)
    assert (path / "dict.de.txt").read_text(encoding="utf-8") == text
    assert db.src_dict.symbols == [*SPECIAL_SYMBOLS, "b", "a", "<unk>", "b"]
    assert ids(db, "train", 0)[1] == [7, 5, EOS]  # b is its last row; c, d stay <unk> (3)
    assert ids(db, "train", 0)[2] == [UNK, 7, EOS]


@pytest.mark.parametrize(
    "key, content, line, words",
    [
        ("src_dict", None, None, "data.src_dict: dictionary file not found"),
        ("src_dict", "b 9\nzz\n", 2, "malformed line"),
        ("tgt_dict", "x 1\ny 2\nx 3\n", 3, "duplicate symbol 'x'"),
        ("src_dict", "<unk> 4\n", 1, "duplicate symbol '<unk>'"),
        ("src_dict", b"b 9\n\xff 1\n", None, "not valid UTF-8"),
        ("tgt_dict", "x 1\n\ny 2\n", 2, "empty line"),
    ],
)
def test_a_bad_dictionary_file_is_refused_with_file_and_line(tmp_path, key, content, line, words):
    corpus = write_corpus(tmp_path / "corpus")
    path = tmp_path / "dicts" / f"dict.{key[:3]}.txt"
    if content is not None:
        write_dict(path, content)
    cache = tmp_path / "cache"
    with pytest.raises(DataError) as info:
        prepare_databin(data_cfg(corpus, **{key: str(path)}), str(cache), False)
    where = f"{path}:{line}: " if line else f"{path}: "
    assert where in str(info.value) and words in str(info.value)
    assert not list((cache / "databin").glob("given-*"))


def test_training_runs_on_a_given_dictionary(tiny_data, tmp_path, one_thread, monkeypatch):
    from convseq.tasks.train import train  # imported late: training pulls in Lightning

    counts = Counter((tiny_data["corpus"] / "train.src").read_text(encoding="utf-8").split())
    kept = sorted(counts)[::2]  # every other word, alphabetically: the rest is <unk>
    given = write_dict(tmp_path / "dict.src.txt", "".join(f"{w} {counts[w]}\n" for w in kept))
    tiny = {"corpus": tiny_data["corpus"], "cache": tmp_path / "cache"}
    out = tmp_path / "run"
    monkeypatch.chdir(tmp_path)  # given relative to the working folder, as on a command line
    train(tiny_config(tiny, out, "data.src_dict=dict.src.txt", "max_update=4", "final_test=false"))
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 4
    assert ckpt["hyper_parameters"]["src_vocab"] == [*SPECIAL_SYMBOLS, *kept]
    # the run records the file by its absolute path: generation from another folder finds it
    assert ckpt["datamodule_hyper_parameters"]["data"]["src_dict"] == given
