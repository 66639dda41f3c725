"""Frozen corpora and settings whose data-bins are pinned in `fixtures/databin_sha256.json`.

The generators here must never change: the fixture holds the sha256 of every file that the
preprocessing of one commit made from them (see `fixtures/record_databin_sha256.py`), and
`test_reference_databins.py` checks that today's code still makes the very same bytes.
"""

from __future__ import annotations

import random
from pathlib import Path

from convseq.data.toy.corpus import write_toy_corpus

_SYLLABLES_DE = ["ha", "us", "hun", "d", "kat", "ze", "bau", "m", "grü", "n", "läu", "ft", "schö"]
_SYLLABLES_EN = ["ho", "use", "do", "g", "ca", "t", "tr", "ee", "gre", "en", "ru", "ns", "pre"]


def _words(rng: random.Random, syllables: list[str], n: int) -> list[str]:
    return ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(n)]


def _synthetic(n: int, seed: int) -> tuple[list[str], list[str]]:
    """`n` sentence pairs of made-up words; word i of the source glosses word i of the target."""
    rng = random.Random(seed)
    de_lex, en_lex = _words(rng, _SYLLABLES_DE, 400), _words(rng, _SYLLABLES_EN, 400)
    src, tgt = [], []
    for _ in range(n):
        idx = [min(int(rng.expovariate(1 / 60)), 399) for _ in range(rng.randint(1, 14))]
        src.append(" ".join(de_lex[i] for i in idx) + rng.choice(["", " .", " ?"]))
        tgt.append(" ".join(en_lex[i] for i in reversed(idx)) + rng.choice(["", " .", " !"]))
    return src, tgt


def _write(folder: Path, name: str, lines: list[str], newline: str = "\n", bom: bool = False):
    text = ("\ufeff" if bom else "") + "".join(line + newline for line in lines)
    (folder / name).write_bytes(text.encode("utf-8"))


def _synthetic_corpus(folder: Path, seed: int) -> None:
    """Train/valid/test with the awkward lines preprocessing must handle the same way."""
    folder.mkdir(parents=True, exist_ok=True)
    src, tgt = _synthetic(2400, seed)
    train_src, train_tgt = src[:2000], tgt[:2000]
    # Skipped train pairs: an empty source, a whitespace-only target, a "@@" line, an over-long
    # pair; kept: a line with a no-break space and a tab inside.
    train_src[10], train_tgt[20], train_src[30] = "", " \u00a0 ", "@@"
    train_src[40] = " ".join(["grühaus"] * 150)
    train_src[50] = "kat\u00a0ze\tbau ."
    valid_src, valid_tgt = src[2000:2200], tgt[2000:2200]
    valid_src[5], valid_tgt[6] = "", ""  # kept: valid/test lines are never dropped for being empty
    valid_tgt[7] = " ".join(["treeho"] * 120)  # over-long: skipped when eval_overlong=skip
    valid_src[8] = "schö zzz \u00e9t\u00e9 ünbekannt"  # characters train never saw
    _write(folder, "train.de", train_src)
    _write(folder, "train.en", train_tgt, newline="\r\n")
    _write(folder, "valid.de", valid_src, bom=True)
    _write(folder, "valid.en", valid_tgt)
    _write(folder, "test.de", src[2200:])
    _write(folder, "test.en", tgt[2200:])


def write_reference_corpus(name: str, folder: Path) -> dict:
    """Write corpus `name` into `folder` and return its `data` config (a plain dict)."""
    base = {"name": name, "dir": str(folder), "max_positions": 1022}
    if name == "toy-words":
        write_toy_corpus(folder, seed=1, n_train=3000, n_valid=300, n_test=300)
        return {**base, "src_lang": "src", "tgt_lang": "tgt", "subword": {"type": "none"}}
    if name == "toy-words-joined":
        write_toy_corpus(folder, seed=2, n_train=2000, n_valid=200, n_test=200)
        return {
            **base,
            "src_lang": "src",
            "tgt_lang": "tgt",
            "subword": {"type": "none"},
            "vocab": {"joined": True, "threshold": 3, "nwords": 120, "padding_factor": 16},
        }
    if name == "synthetic-bpe-joint":
        _synthetic_corpus(folder, seed=11)
        return {
            **base,
            "src_lang": "de",
            "tgt_lang": "en",
            "subword": {"type": "bpe", "vocab_size": 500, "joint": True},
            "vocab": {"joined": True},
            "max_positions": 100,
            "drop_train_regex": "@@",
            "eval_overlong": "skip",
        }
    if name == "synthetic-unigram-separate":
        _synthetic_corpus(folder, seed=12)
        return {
            **base,
            "src_lang": "de",
            "tgt_lang": "en",
            "subword": {"type": "unigram", "vocab_size": 300, "joint": False},
            "vocab": {"joined": False, "threshold": 2, "nwords": 250},
            "max_positions": 100,
            "eval_overlong": "skip",
        }
    raise KeyError(name)


REFERENCE_CORPORA = (
    "toy-words",
    "toy-words-joined",
    "synthetic-bpe-joint",
    "synthetic-unigram-separate",
)
SENTENCEPIECE_CORPORA = ("synthetic-bpe-joint", "synthetic-unigram-separate")  # subword models


def why_pins_do_not_apply(name: str, fixture: dict) -> str | None:
    """Why the pinned bytes of corpus `name` cannot be asked of this environment, or None.

    The pins hold on any CPU: the data-bins are integers and text, and sentencepiece's trainer
    runs the same compiled code on every x86-64 machine (it was checked on an AMD EPYC and an
    Intel Xeon with AMX). What they depend on is sentencepiece's own version: another release
    may train another model from the same text, so the subword corpora's pins apply only with
    the version that recorded them.
    """
    import sentencepiece

    pinned = fixture["versions"]["sentencepiece"]
    if name in SENTENCEPIECE_CORPORA and sentencepiece.__version__ != pinned:
        return (
            f"{name}: pinned with sentencepiece {pinned}, installed {sentencepiece.__version__}; "
            "re-record with tests/data/fixtures/record_databin_sha256.py if the change is meant"
        )
    return None
