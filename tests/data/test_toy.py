"""The embedded toy corpus: determinism, caching, and the properties that make it translation."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import sacrebleu

from convseq.data.toy.corpus import (
    baseline_dictionary,
    build_lexicon,
    generate_pairs,
    lexicon_baseline,
    toy_splits,
    write_toy_corpus,
)
from convseq.data.toy.lexicon import source_words
from convseq.errors import DataError

FILES = [f"{s}.{l}" for s in ("train", "valid", "test") for l in ("src", "tgt")]
SMALL = {"n_train": 300, "n_valid": 40, "n_test": 40}


def _digest(folder: Path) -> dict[str, str]:
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in FILES}


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.fixture(scope="module")
def default_corpus(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("toy") / "corpus"
    return out, write_toy_corpus(out)


@pytest.fixture(scope="module")
def splits():
    return toy_splits()


def test_default_corpus_sizes_and_format(default_corpus, splits):
    out, counts = default_corpus
    assert counts == {"train": 20000, "valid": 1000, "test": 1000}
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES + ["toy.json"])
    for name in FILES:
        raw = (out / name).read_bytes()
        assert b"\r" not in raw and raw.endswith(b"\n")
        lines = _lines(out / name)
        split, lang = name.split(".")
        assert len(lines) == counts[split]
        assert all(line and line == line.strip() and "  " not in line for line in lines)
        assert all(line == line.lower() for line in lines)
        # the files are the in-memory splits, joined by single spaces
        assert lines == [" ".join(getattr(p, lang)) for p in splits[split]]
    stamp = json.loads((out / "toy.json").read_text())
    assert stamp["complete"] and stamp["settings"]["seed"] == 1


def test_reuse_and_rewrite(default_corpus, tmp_path):
    out, _ = default_corpus
    before = {n: (out / n).stat().st_mtime_ns for n in FILES}
    assert write_toy_corpus(out)["train"] == 20000
    assert {n: (out / n).stat().st_mtime_ns for n in FILES} == before  # reused, not rewritten

    small = tmp_path / "c"
    write_toy_corpus(small, **SMALL)
    reference = _digest(small)
    with open(small / "valid.tgt", "a", encoding="utf-8") as f:  # damaged file -> regenerated
        f.write("extra\n")
    write_toy_corpus(small, **SMALL)
    assert _digest(small) == reference
    write_toy_corpus(small, **{**SMALL, "n_test": 10})  # other settings -> rewritten
    assert len(_lines(small / "test.src")) == 10
    assert _digest(small)["train.src"] == reference["train.src"]


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    write_toy_corpus(tmp_path / "a", seed=1, **SMALL)
    write_toy_corpus(tmp_path / "b", seed=1, **SMALL)
    write_toy_corpus(tmp_path / "c", seed=2, **SMALL)
    a, b, c = (_digest(tmp_path / x) for x in "abc")
    assert a == b
    assert all(a[n] != c[n] for n in FILES)


def test_bytes_do_not_depend_on_hash_seed(tmp_path):
    code = (
        "import sys, hashlib; from convseq.data.toy.corpus import toy_splits;"
        "s = toy_splits(3, 200, 20, 20);"
        "print(hashlib.sha256(repr(s).encode()).hexdigest())"
    )
    digests = set()
    for hash_seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        res = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        digests.add(res.stdout.strip())
    assert len(digests) == 1


def _write_small(out: str) -> dict:
    return write_toy_corpus(out, seed=5, **SMALL)


def test_concurrent_writers_agree(tmp_path):
    out = tmp_path / "shared"
    with mp.get_context("spawn").Pool(2) as pool:
        results = pool.map(_write_small, [str(out), str(out)])
    assert results[0] == results[1] == {"train": 300, "valid": 40, "test": 40}
    write_toy_corpus(tmp_path / "alone", seed=5, **SMALL)
    assert _digest(out) == _digest(tmp_path / "alone")
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # temp folders removed


def test_refuses_files_it_did_not_write(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "train.src").write_text("my own data\n")
    with pytest.raises(DataError, match="train.src"):
        write_toy_corpus(out, **SMALL)
    assert (out / "train.src").read_text() == "my own data\n"
    empty = tmp_path / "empty"  # an existing empty folder is filled
    empty.mkdir()
    write_toy_corpus(empty, **SMALL)
    assert len(_lines(empty / "train.tgt")) == 300


def test_bad_sizes():
    with pytest.raises(ValueError, match="n_valid"):
        toy_splits(1, 10, -1, 10)
    with pytest.raises(ValueError, match="n_train"):
        toy_splits(1, 0, 10, 10)


def test_lexicon_and_vocabulary_size(splits):
    lex = build_lexicon(1)
    verbs = lex.transitive + lex.intransitive
    n_lemmas = len(lex.nouns) + len(lex.adjectives) + len(verbs) + len(lex.adverbs)
    assert 200 <= n_lemmas <= 400
    # source words of different classes never share a spelling (the parse is unambiguous)
    classes = [
        {w for n in lex.nouns for w in (n.sg, n.pl)},
        {a.sg for a in lex.adjectives},
        {w for v in verbs for w in (v.base, v.third, v.past)},
        {a for a, _ in lex.adverbs},
    ]
    assert sum(len(c) for c in classes) == len(set().union(*classes))
    # every target form of every lemma is a distinct word
    forms = [f for n in lex.nouns for row in n.forms for f in row]
    forms += [f for a in lex.adjectives + lex.determiners for row in a.forms for f in row]
    forms += [f for v in verbs for row in v.forms for f in row]
    forms += [t for _, t in lex.adverbs + lex.prepositions + lex.conjunctions]
    assert len(forms) == len(set(forms))
    src_types = {w for p in splits["train"] for w in p.src}
    tgt_types = {w for p in splits["train"] for w in p.tgt}
    print(f"types: source {len(src_types)}, target {len(tgt_types)}")
    assert 300 <= len(src_types) <= 800
    assert 500 <= len(tgt_types) <= 1500
    assert not src_types & tgt_types  # the target is no copy of the source
    assert src_types <= set(source_words())


def test_lengths(splits):
    for name, pairs in splits.items():
        for side in ("src", "tgt"):
            lengths = [len(getattr(p, side)) for p in pairs]
            mean = sum(lengths) / len(lengths)
            print(f"{name}.{side}: mean {mean:.2f}, min {min(lengths)}, max {max(lengths)}")
            assert 3 <= min(lengths) and max(lengths) <= 30
            assert 9.0 <= mean <= 14.0
    train = [len(p.src) for p in splits["train"]]
    assert max(train) == 30 and sum(n >= 20 for n in train) > 500  # long sentences are common


def test_splits_disjoint(splits):
    train = {p.src for p in splits["train"]}
    assert len(train) == len(splits["train"])
    for name in ("valid", "test"):
        assert not train & {p.src for p in splits[name]}
    assert not {p.src for p in splits["valid"]} & {p.src for p in splits["test"]}


def test_target_is_a_function_of_the_source():
    seen: dict[tuple, tuple] = {}
    repeats = 0
    for pair in generate_pairs(7, 30000):
        first = seen.setdefault(pair.src, pair.tgt)
        repeats += first is not pair.tgt
        assert first == pair.tgt, pair.src
    assert repeats > 50  # short sentences recur, so the check had something to compare


def test_reordering_present(splits):
    test = splits["test"]
    reordered = sum(any(a > b for a, b in zip(p.align, p.align[1:])) for p in test)
    print(f"reordered: {reordered / len(test):.1%} of test sentences")
    assert reordered / len(test) >= 0.7
    # every target word is aligned to a distinct source word
    for p in test:
        assert -1 not in p.align and len(set(p.align)) == len(p.align)


def test_agreement_present(splits):
    lex = build_lexicon(1)
    aligned: dict[str, set] = defaultdict(set)
    for p in splits["train"]:
        for j, i in enumerate(p.align):
            aligned[p.src[i]].add(p.tgt[j])
    nouns = [n.sg for n in lex.nouns]
    adjectives = [a.sg for a in lex.adjectives]
    verbs = [v.base for v in lex.transitive + lex.intransitive]
    # nouns: case depends on the role; adjectives: the noun's gender and number;
    # verbs: the subject's person and number
    assert all(len(aligned[w]) >= 2 for w in nouns)
    assert all(len(aligned[w]) == 4 for w in adjectives)
    assert all(len(aligned[w]) >= 4 for w in verbs)
    assert len(aligned["the"]) == 4 and len(aligned["that"]) == 4
    # the past tense form carries no person in the source, but does in the target
    assert all(len(aligned[v.past]) == 4 for v in lex.transitive)


def test_baselines_score_far_below_a_translation(splits):
    test = splits["test"]
    refs = [" ".join(p.tgt) for p in test]
    lexical = [lexicon_baseline(" ".join(p.src)) for p in test]
    bleu = sacrebleu.corpus_bleu(lexical, [refs]).score
    # knows the word order (from the alignment) but glosses every word by its commonest form
    table = baseline_dictionary(1)
    ordered = [" ".join(table[p.src[i]] for i in p.align) for p in test]
    bleu_ordered = sacrebleu.corpus_bleu(ordered, [refs]).score
    # knows every target form but keeps the source order
    monotone = [
        " ".join(p.tgt[j] for j in sorted(range(len(p.tgt)), key=p.align.__getitem__)) for p in test
    ]
    bleu_monotone = sacrebleu.corpus_bleu(monotone, [refs]).score
    print(
        f"test BLEU: word-by-word lexicon {bleu:.2f}, reordered lexicon {bleu_ordered:.2f}, "
        f"right forms in source order {bleu_monotone:.2f}"
    )
    assert bleu <= 50
    assert bleu_ordered <= 60 and bleu_monotone <= 60
    assert bleu < bleu_ordered  # reordering helps, but agreement still matters


def test_baseline_on_written_test_split(default_corpus):
    out, _ = default_corpus
    hyps = [lexicon_baseline(line) for line in _lines(out / "test.src")]
    bleu = sacrebleu.corpus_bleu(hyps, [_lines(out / "test.tgt")]).score
    print(f"lexicon baseline BLEU on {out / 'test.src'}: {bleu:.2f}")
    assert 0 < bleu <= 50
    assert lexicon_baseline("the dog does not see me").count(" ") == 4  # "does" has no gloss
