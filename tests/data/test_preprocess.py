"""Preprocessing end to end on tiny corpora: ids, policies, errors, caching, concurrency, crashes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import pickle
import random
import shutil
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock
from omegaconf import OmegaConf

import convseq.data.binarize as bz
import convseq.data.preprocess as pp
from convseq.data.config import DataConfig
from convseq.data.databin import DataBin
from convseq.data.indexed import write_split
from convseq.errors import DataError

# A corpus small enough to encode by hand. Train pair 3 is empty on the source side and pair 4
# has 6 source tokens (7 with EOS > max_positions=6): both are skipped.
TINY = {
    "train": (["a b", " b c b ", "  ", "a a a a a a"], ["x y", "y", "z", "x"]),
    "valid": (["a d", ""], ["y y x", "x"]),
    "test": (["c", "b a"], ["q", "y"]),
}
# Dictionaries from the two kept train pairs: de b 3, a 1, c 1; en y 2, x 1 (padded to 8).
DICT_DE = "b 3\na 1\nc 1\nmadeupword0000 0\n"
DICT_EN = "y 2\nx 1\nmadeupword0000 0\nmadeupword0001 0\n"
IDS = {  # b=4 a=5 c=6 | y=4 x=5; unk=3, eos=2
    "train": ([[5, 4, 2], [4, 6, 4, 2]], [[5, 4, 2], [4, 2]]),
    "valid": ([[5, 3, 2], [2]], [[4, 4, 5, 2], [5, 2]]),
    "test": ([[6, 2], [4, 5, 2]], [[3, 2], [4, 2]]),
}


def write_corpus(folder: Path, splits=TINY, newline: str = "\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, (src, tgt) in splits.items():
        for lang, lines in (("de", src), ("en", tgt)):
            text = "".join(line + newline for line in lines)
            (folder / f"{split}.{lang}").write_bytes(text.encode("utf-8"))
    return folder


def make_cfg(corpus: Path, **over) -> dict:
    cfg = {
        "name": "tiny",
        "dir": str(corpus),
        "src_lang": "de",
        "tgt_lang": "en",
        "subword": {"type": "none"},
        "vocab": {"joined": False},
        "max_positions": 6,
    }
    for key, value in over.items():
        if isinstance(value, dict):
            cfg[key] = {**cfg.get(key, {}), **value}
        else:
            cfg[key] = value
    return cfg


def synthetic_corpus(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Sentences of made-up words (German-ish and English-ish letters) for sentencepiece."""
    rng = random.Random(seed)
    de_words = ["haus", "hund", "katze", "baum", "grün", "läuft", "schön", "straße", "über"]
    en_words = ["house", "dog", "cat", "tree", "green", "runs", "pretty", "street", "over"]
    src, tgt = [], []
    for _ in range(n):
        idx = [rng.randrange(len(de_words)) for _ in range(rng.randint(2, 8))]
        src.append(" ".join(de_words[i] + rng.choice(["", "en", "er"]) for i in idx))
        tgt.append(" ".join(en_words[i] + rng.choice(["", "s"]) for i in idx))
    return src, tgt


@pytest.fixture
def tiny(tmp_path):
    return write_corpus(tmp_path / "corpus"), tmp_path / "cache"


# -- round trip ------------------------------------------------------------------------------
def test_binarise_read_round_trip(tiny):
    corpus, cache = tiny
    path = pp.prepare_databin(make_cfg(corpus), str(cache), progress=False)
    assert path.parent == cache / "databin" and path.name.startswith("tiny-de-en-")
    assert len(path.name) == len("tiny-de-en-") + 12
    assert (path / "dict.de.txt").read_text() == DICT_DE
    assert (path / "dict.en.txt").read_text() == DICT_EN
    db = DataBin(path)
    for split, (want_src, want_tgt) in IDS.items():
        src, tgt = db.split(split)
        assert [src[i].tolist() for i in range(len(src))] == want_src
        assert [tgt[i].tolist() for i in range(len(tgt))] == want_tgt
        assert src.sizes.tolist() == [len(x) for x in want_src]
    np.testing.assert_array_equal(db.lines("train"), [0, 1])
    assert db.text("valid", "src") == ["a d", ""]
    assert db.text("test", "tgt") == ["q", "y"]
    np.testing.assert_array_equal(db.encode("  a d ", "src"), [5, 3, 2])
    assert db.decode(np.array([5, 4, 5, 2, 1, 1]), "tgt") == "x y x"
    names = {p.name for p in path.iterdir()}
    assert {"meta.json", "train.de-en.de.tokens.npy", "test.de-en.en.offsets.npy"} <= names
    assert not any(n.startswith("spm") for n in names)


def test_meta_json_counts_and_settings(tiny):
    corpus, cache = tiny
    path = pp.prepare_databin(make_cfg(corpus), str(cache), progress=False)
    meta = json.loads((path / "meta.json").read_text())
    train, valid = meta["splits"]["train"], meta["splits"]["valid"]
    assert train["input_lines"] == 4 and train["sentences"] == 2
    assert train["skipped"] == {"empty": 1, "too_long": 1}
    assert train["src"]["tokens"] == 7 and train["tgt"]["tokens"] == 5
    assert valid["skipped"] == {} and valid["sentences"] == 2
    assert valid["src"]["unk"] == 1 and valid["src"]["unk_rate"] == pytest.approx(1 / 4)
    assert meta["splits"]["test"]["tgt"]["unk"] == 1
    assert meta["vocab"]["src_size"] == 8 and meta["vocab"]["tgt_size"] == 8
    assert meta["subword"]["type"] == "none" and meta["max_positions"] == 6
    raw = (corpus / "train.de").read_bytes()
    assert meta["inputs"]["train.de"]["sha256"] == hashlib.sha256(raw).hexdigest()
    assert meta["inputs"]["train.de"]["lines"] == 4
    assert path.name.endswith(meta["key"][:12])


def test_summary_printed(tiny, capsys):
    corpus, cache = tiny
    pp.prepare_databin(make_cfg(corpus), str(cache), progress=False)
    out = capsys.readouterr().out
    assert "train" in out and "2 (empty 1, too_long 1)" in out
    assert "de 8, en 8 symbols" in out


def test_joined_dictionary_written_under_both_names(tiny):
    corpus, cache = tiny
    path = pp.prepare_databin(make_cfg(corpus, vocab={"joined": True}), str(cache), progress=False)
    text = (path / "dict.de.txt").read_text()
    assert text == (path / "dict.en.txt").read_text()
    # Joined counts over both sides: b 3, y 2, a 1, c 1, x 1 (ties alphabetical); 4 specials + 5
    # symbols = 9, padded to 16.
    pads = "".join(f"madeupword{i:04d} 0\n" for i in range(7))
    assert text == "b 3\ny 2\na 1\nc 1\nx 1\n" + pads


# -- sentencepiece ---------------------------------------------------------------------------
def test_sentencepiece_joint_bpe_round_trip_and_quiet(tmp_path, capfd):
    src, tgt = synthetic_corpus(300)
    splits = {
        "train": (src[:240], tgt[:240]),
        "valid": (src[240:270], tgt[240:270]),
        "test": (src[270:], tgt[270:]),
    }
    corpus = write_corpus(tmp_path / "c", splits)
    cfg = make_cfg(
        corpus,
        subword={"type": "bpe", "vocab_size": 60, "joint": True},
        vocab={"joined": True},
        max_positions=1022,
    )
    path = pp.prepare_databin(cfg, str(tmp_path / "cache"), progress=False)
    out, err = capfd.readouterr()
    assert err == ""  # sentencepiece's trainer log would land on stderr
    assert "trainer_interface" not in out and out.startswith("data-bin tiny de->en")
    assert (path / "spm.model").is_file() and not (path / "spm.de.model").exists()
    db = DataBin(path)
    assert db.meta["subword"]["models"] == {"de": "spm.model", "en": "spm.model"}
    assert db.meta["subword"]["pieces"]["de"] <= 60
    assert any(s.startswith("\u2581") for s in db.src_dict.symbols)
    vsrc, vtgt = db.split("valid")
    for i in range(len(vsrc)):
        np.testing.assert_array_equal(db.encode(splits["valid"][0][i], "src"), vsrc[i])
        assert db.decode(vtgt[i], "tgt") == splits["valid"][1][i]
        assert db.decode(vsrc[i], "src") == splits["valid"][0][i]
    # A DataBin travels to DataLoader worker processes: the model and arrays come along.
    clone = pickle.loads(pickle.dumps(db))
    np.testing.assert_array_equal(clone.split("valid")[0][0], vsrc[0])
    assert clone.decode(vtgt[0]) == splits["valid"][1][0]
    # Subwords: more tokens than words (every sentence has at least one EOS too).
    n_words = sum(len(s.split()) + 1 for s in splits["valid"][0])
    assert db.meta["splits"]["valid"]["src"]["tokens"] > n_words


def test_sentencepiece_per_language_unigram(tmp_path):
    src, tgt = synthetic_corpus(200, seed=1)
    splits = {
        "train": (src[:160], tgt[:160]),
        "valid": (src[160:180], tgt[160:180]),
        "test": (src[180:], tgt[180:]),
    }
    corpus = write_corpus(tmp_path / "c", splits)
    cfg = make_cfg(
        corpus, subword={"type": "unigram", "vocab_size": 40, "joint": False}, max_positions=1022
    )
    path = pp.prepare_databin(cfg, str(tmp_path / "cache"), progress=False)
    assert (path / "spm.de.model").is_file() and (path / "spm.en.model").is_file()
    assert not (path / "spm.model").exists()
    db = DataBin(path)
    assert db.src_dict != db.tgt_dict
    assert "\u2581house" in db.tgt_dict and "\u2581house" not in db.src_dict
    _, ttgt = db.split("test")
    assert [db.decode(ttgt[i]) for i in range(len(ttgt))] == splits["test"][1]


# -- bad input ---------------------------------------------------------------------------------
def _bad(corpus: Path, name: str, data: bytes) -> Path:
    (corpus / name).write_bytes(data)
    return corpus / name


GOOD_TRAIN_DE = b"a b\nb c\nd\na\n"


@pytest.mark.parametrize(
    "name, data, over, line, words",
    [
        ("train.de", b"a b\n\xff\xfe c\n", {}, 2, "not valid UTF-8"),
        ("valid.en", b"y y x\nx\rz\n", {}, 2, "carriage return"),
        ("valid.de", b"a\na b c d e f\n", {}, 2, "longer than data.max_positions=6"),
        ("train.en", "x y\ny\n \u00a0\nx\n".encode(), {"train_invalid": "error"}, 3, "empty line"),
        (
            "train.de",
            b"a b\nb c\nd\na a a a a a\n",
            {"train_invalid": "error"},
            4,
            "sentence of 7 tokens",
        ),
    ],
)
def test_bad_input_error_names_file_and_line(tiny, name, data, over, line, words):
    corpus, cache = tiny
    if name != "train.de" and over:
        _bad(corpus, "train.de", GOOD_TRAIN_DE)  # so that the error is on the other side
    path = _bad(corpus, name, data)
    with pytest.raises(DataError) as info:
        pp.prepare_databin(make_cfg(corpus, **over), str(cache), progress=False)
    assert f"{path}:{line}: " in str(info.value)
    assert words in str(info.value)
    assert not list((cache / "databin").glob("tiny-*"))  # nothing half-built left behind


def test_line_count_mismatch_and_missing_file(tiny):
    corpus, cache = tiny
    _bad(corpus, "test.en", b"q\ny\nextra\n")
    with pytest.raises(DataError) as info:
        pp.prepare_databin(make_cfg(corpus), str(cache), progress=False)
    assert f"{corpus / 'test.de'} has 2 lines" in str(info.value)
    assert f"{corpus / 'test.en'} has 3 lines" in str(info.value)
    (corpus / "test.en").unlink()
    with pytest.raises(DataError, match="not found") as info:
        pp.prepare_databin(make_cfg(corpus), str(cache), progress=False)
    assert str(corpus / "test.en") in str(info.value)


def test_eval_overlong_skip_is_counted(tiny):
    corpus, cache = tiny
    _bad(corpus, "valid.de", b"a\na b c d e f\nb\n")
    _bad(corpus, "valid.en", b"x\ny\n\n")
    path = pp.prepare_databin(make_cfg(corpus, eval_overlong="skip"), str(cache), progress=False)
    db = DataBin(path)
    assert db.meta["splits"]["valid"]["skipped"] == {"too_long": 1}
    np.testing.assert_array_equal(db.lines("valid"), [0, 2])
    assert db.text("valid", "tgt") == ["x", ""]  # the empty target line stays
    assert db.split("valid")[1][1].tolist() == [2]


def test_crlf_input_gives_the_same_ids(tmp_path):
    lf = pp.prepare_databin(
        make_cfg(write_corpus(tmp_path / "lf")), str(tmp_path / "k"), progress=False
    )
    crlf = pp.prepare_databin(
        make_cfg(write_corpus(tmp_path / "crlf", newline="\r\n")),
        str(tmp_path / "k"),
        progress=False,
    )
    assert lf != crlf  # different bytes in, different key
    a, b = DataBin(lf), DataBin(crlf)
    assert b.meta["inputs"]["train.de"]["crlf"] is True
    for split in ("train", "valid", "test"):
        for x, y in zip(a.split(split), b.split(split)):
            np.testing.assert_array_equal(x.tokens, y.tokens)
            np.testing.assert_array_equal(x.offsets, y.offsets)


@pytest.mark.parametrize(
    "over, words",
    [
        ({"subwrd": {"type": "bpe"}}, "data.subwrd"),
        ({"subword": {"type": "wordpiece"}}, "data.subword.type"),
        ({"tgt_lang": "de"}, "must differ"),
        ({"generator": "web"}, "data.generator"),
        ({"max_positions": "long"}, "data.max_positions"),
    ],
)
def test_invalid_settings(tiny, over, words):
    corpus, cache = tiny
    with pytest.raises(DataError, match=words):
        pp.prepare_databin(make_cfg(corpus, **over), str(cache), progress=False)


# -- caching -------------------------------------------------------------------------------------
def test_reuse_and_rebuild(tiny):
    corpus, cache = tiny
    cfg = make_cfg(corpus)
    path, built = pp.ensure_databin(cfg, str(cache), progress=False)
    assert built
    stamp = (path / "meta.json").stat().st_mtime_ns
    inode = path.stat().st_ino
    # Same inputs and settings, given as a DictConfig and as a DataConfig: reused as is.
    again, built = pp.ensure_databin(OmegaConf.create(cfg), str(cache), progress=False)
    assert (again, built) == (path, False)
    structured = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), cfg))
    assert pp.ensure_databin(structured, str(cache), progress=False) == (path, False)
    # Settings that do not change the content keep the key.
    same = make_cfg(corpus, num_workers=3, subword={"type": "none", "vocab_size": 5})
    assert pp.ensure_databin(same, str(cache), progress=False) == (path, False)
    assert (path / "meta.json").stat().st_mtime_ns == stamp and path.stat().st_ino == inode
    # A changed setting or input gives a new data-bin; the old one stays for whoever uses it.
    other, built = pp.ensure_databin(
        make_cfg(corpus, vocab={"threshold": 2}), str(cache), progress=False
    )
    assert built and other != path
    assert DataBin(other).src_dict.symbols[4:] == [
        "b",
        "madeupword0000",
        "madeupword0001",
        "madeupword0002",
    ]
    (corpus / "test.en").write_text("q\nx\n")
    changed, built = pp.ensure_databin(cfg, str(cache), progress=False)
    assert built and changed not in (path, other)
    assert DataBin(changed).split("test")[1][1].tolist() == [5, 2]
    assert DataBin(path).split("test")[1][1].tolist() == [4, 2]


def test_databin_path_matches_without_building(tiny):
    corpus, cache = tiny
    predicted = pp.databin_path(make_cfg(corpus), str(cache))
    assert not predicted.exists()
    assert pp.prepare_databin(make_cfg(corpus), str(cache), progress=False) == predicted


def _child_build(cfg: dict, cache: str, queue) -> None:
    try:
        path, built = pp.ensure_databin(cfg, cache, progress=False)
        queue.put((str(path), built))
    except BaseException as e:  # report, do not hang the parent
        queue.put(("error", repr(e)))


@pytest.mark.skipif(sys.platform != "linux", reason="uses fork")
def test_concurrent_builders_build_once(tiny):
    corpus, cache = tiny
    cfg = make_cfg(corpus)
    final = pp.databin_path(cfg, str(cache))
    final.parent.mkdir(parents=True)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    # Hold the build lock so that all three processes are certain to contend for it.
    with FileLock(str(final.parent / f".{final.name}.lock")):
        procs = [ctx.Process(target=_child_build, args=(cfg, str(cache), queue)) for _ in range(3)]
        for p in procs:
            p.start()
        time.sleep(0.5)
        assert not final.exists()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert {r[0] for r in results} == {str(final)}, results
    assert sorted(r[1] for r in results) == [False, False, True]
    DataBin(final).check()


def test_lost_rename_race_uses_the_winner(tiny, monkeypatch):
    # Another machine (whose lock this one cannot see) renames its build into place first.
    corpus, cache = tiny
    real_build = pp.build_databin

    def build_then_lose(cfg, paths, checksums, key, out, progress=True):
        meta = real_build(cfg, paths, checksums, key, out, progress)
        final = out.parent / out.name.split(".tmp-")[0][1:]
        shutil.copytree(out, final)
        (final / "winner").touch()
        return meta

    monkeypatch.setattr(pp, "build_databin", build_then_lose)
    path, built = pp.ensure_databin(make_cfg(corpus), str(cache), progress=False)
    assert not built and (path / "winner").is_file()
    assert not list(path.parent.glob(".*.tmp-*"))
    DataBin(path).check()


def test_failed_build_leaves_nothing(tiny, monkeypatch):
    corpus, cache = tiny
    calls = []
    write_side = bz.write_side

    def failing(prefix, *args):
        calls.append(prefix)
        if len(calls) == 3:
            raise RuntimeError("disk full")
        return write_side(prefix, *args)

    monkeypatch.setattr(bz, "write_side", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        pp.prepare_databin(make_cfg(corpus), str(cache), progress=False)
    root = cache / "databin"
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(bz, "write_side", write_side)
    path, built = pp.ensure_databin(make_cfg(corpus), str(cache), progress=False)
    assert built and DataBin(path).split("test")[0][0].tolist() == [6, 2]


def _child_crash(cfg: dict, cache: str) -> None:
    calls = []
    write_side = bz.write_side

    def dying(prefix, *args):
        calls.append(prefix)
        if len(calls) == 3:
            os._exit(7)  # killed mid-build: no cleanup runs
        return write_side(prefix, *args)

    bz.write_side = dying
    pp.prepare_databin(cfg, cache, progress=False)


@pytest.mark.skipif(sys.platform != "linux", reason="uses fork")
def test_killed_build_is_never_picked_up(tiny):
    corpus, cache = tiny
    cfg = make_cfg(corpus)
    final = pp.databin_path(cfg, str(cache))
    proc = multiprocessing.get_context("fork").Process(target=_child_crash, args=(cfg, str(cache)))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 7
    leftovers = list(final.parent.glob(f".{final.name}.tmp-*"))
    assert len(leftovers) == 1 and any(leftovers[0].iterdir())
    assert not final.exists()
    with pytest.raises(DataError, match="meta.json missing"):
        DataBin(leftovers[0])
    path, built = pp.ensure_databin(cfg, str(cache), progress=False)
    assert (path, built) == (final, True)
    assert not leftovers[0].exists()
    assert DataBin(path).split("train")[0][1].tolist() == [4, 6, 4, 2]


def test_damaged_databin_is_detected_and_rebuilt(tiny):
    corpus, cache = tiny
    path = pp.prepare_databin(make_cfg(corpus), str(cache), progress=False)
    tokens = path / "train.de-en.de.tokens.npy"
    tokens.write_bytes(tokens.read_bytes()[:-4])  # truncated
    with pytest.raises(DataError, match="truncated or damaged") as info:
        DataBin(path).split("train")
    assert str(tokens) in str(info.value)
    # Arrays that are readable but do not match meta.json.
    path2, built = pp.ensure_databin(make_cfg(corpus), str(cache), progress=False)
    assert (path2, built) == (path, True)  # the damaged one was replaced
    write_split(path / "test.de-en.en", [np.array([4, 2])], 8)
    with pytest.raises(DataError, match="meta.json says 2 / 4"):
        DataBin(path).split("test")
    (path / "meta.json").unlink()
    with pytest.raises(DataError, match="meta.json missing"):
        DataBin(path)
    assert pp.ensure_databin(make_cfg(corpus), str(cache), progress=False) == (path, True)
    DataBin(path).check()


def test_databin_api_errors(tiny):
    corpus, cache = tiny
    db = DataBin(pp.prepare_databin(make_cfg(corpus), str(cache), progress=False))
    with pytest.raises(DataError, match="no split 'dev'"):
        db.split("dev")
    with pytest.raises(DataError, match="valid"):
        db.text("train")
    with pytest.raises(DataError, match="data-bin folder not found"):
        DataBin(cache / "nothing")


# -- generator and progress -----------------------------------------------------------------------
def test_generator_runs_before_reading(tmp_path, monkeypatch):
    calls = []

    def fake_write_toy_corpus(out_dir, seed=1):
        calls.append((Path(out_dir), seed))
        write_corpus(Path(out_dir))
        return {}

    fake = types.ModuleType("convseq.data.toy.corpus")
    fake.write_toy_corpus = fake_write_toy_corpus
    monkeypatch.setitem(sys.modules, "convseq.data.toy.corpus", fake)
    # dir unset: the generator writes into its own folder of the cache, then it is read
    cfg = make_cfg(tmp_path / "unused", generator="toy", generator_seed=5)
    cfg = {**cfg, "dir": None} if isinstance(cfg, dict) else dataclasses.replace(cfg, dir=None)
    path = pp.prepare_databin(cfg, str(tmp_path / "cache"), progress=False)
    assert calls[0] == (tmp_path / "cache" / "corpora" / "toy-seed5", 5)
    assert DataBin(path).meta["splits"]["train"]["sentences"] == 2


def test_progress_bar_on_large_inputs(tiny, monkeypatch, capfd):
    corpus, cache = tiny
    pp.prepare_databin(make_cfg(corpus), str(cache / "a"), progress=True)
    assert "binarise" not in capfd.readouterr().err  # small: no bar
    monkeypatch.setattr(bz, "PROGRESS_MIN_LINES", 1)
    pp.prepare_databin(make_cfg(corpus), str(cache / "b"), progress=False)
    assert "binarise" not in capfd.readouterr().err  # bars switched off
    pp.prepare_databin(make_cfg(corpus), str(cache / "c"), progress=True)
    err = capfd.readouterr().err
    assert "binarise train.de" in err and "segment valid.de-en" in err
