"""convseq.evaluation.bootstrap where the paired test has nothing to measure: equal scores, equal
sentence-level statistics, a one-sentence test set, empty files. Each gets p = 1 and its note,
never sacreBLEU's smallest p; a real difference stays significant."""

from __future__ import annotations

import random

import pytest
from sacrebleu.metrics import BLEU

from convseq.errors import DataError
from convseq.evaluation.bootstrap import format_table, paired_bootstrap

VOCAB = [f"w{i}" for i in range(200)]
OTHER = [f"x{i}" for i in range(200)]  # words no reference holds


def _sentences(n: int, vocab: list[str], seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(5, 12))) for _ in range(n)]


def _stats(hyps: list[str], refs: list[str]) -> list[tuple]:
    """Each sentence's BLEU statistics (matches and totals per order, lengths)."""
    bleu = BLEU()
    return [
        (tuple(s.counts), tuple(s.totals), s.sys_len, s.ref_len)
        for s in (bleu.sentence_score(h, [r]) for h, r in zip(hyps, refs))
    ]


def test_two_different_systems_that_both_score_zero_are_not_significant():
    refs = _sentences(100, VOCAB, 0)
    a, b = _sentences(100, OTHER, 1), _sentences(100, OTHER, 2)
    assert a != b
    results, signature = paired_bootstrap([("a", a), ("b", b)], refs)
    base, other = results
    assert base.bleu == other.bleu == 0.0
    assert other.p_value == 1.0 and not other.significant
    assert other.note == "same BLEU" and not other.identical
    table = format_table(results, signature)
    assert "| * |" not in table and "| 1.0000 | same BLEU |" in table
    assert "same BLEU: p = 1" in table


def test_equal_sentence_statistics_from_other_words_are_not_significant():
    """Each hypothesis swaps its unmatched words for others no reference holds: other text, the
    same statistics, so every resample gives the difference 0."""
    refs = _sentences(150, VOCAB, 0)
    rng = random.Random(3)
    base = [
        " ".join(w if rng.random() < 0.5 else rng.choice(OTHER) for w in r.split()) for r in refs
    ]
    other = [
        " ".join(w if w.startswith("w") else w.replace("x", "y") for w in h.split()) for h in base
    ]
    assert other != base and _stats(other, refs) == _stats(base, refs)
    results, _ = paired_bootstrap([("base", base), ("other", other)], refs)
    assert 0 < results[0].bleu < 100 and results[1].bleu == results[0].bleu
    assert results[1].p_value == 1.0 and not results[1].significant
    assert results[1].note == "same BLEU"


def test_a_one_sentence_test_set_is_never_significant():
    refs = ["the cat sat on the mat"]
    results, signature = paired_bootstrap(
        [("perfect", ["the cat sat on the mat"]), ("wrong", ["a dog ran"])], refs
    )
    assert results[0].bleu == pytest.approx(100.0) and results[1].bleu == 0.0
    assert results[1].p_value == 1.0 and not results[1].significant
    assert results[1].note == "one sentence"
    assert "| * |" not in format_table(results, signature)


def test_a_constant_real_difference_stays_significant():
    """Every resample gives the same difference here too, but it is 100 BLEU over 40 sentences:
    the guard must not hide it."""
    refs = ["a b c d e"] * 20 + ["f g h i j"] * 20
    perfect, wrong = list(refs), ["k l m n o"] * 40
    results, _ = paired_bootstrap([("wrong", wrong), ("perfect", perfect)], refs)
    assert results[1].bleu - results[0].bleu == pytest.approx(100.0)
    assert results[1].note == "" and results[1].significant
    assert results[1].p_value == pytest.approx(1 / 1001)


def test_an_ordinary_comparison_keeps_sacrebleus_p_value():
    refs = _sentences(120, VOCAB, 0)
    rng = random.Random(4)
    a = [" ".join(w if rng.random() < 0.7 else rng.choice(VOCAB) for w in r.split()) for r in refs]
    b = [" ".join(w if rng.random() < 0.68 else rng.choice(VOCAB) for w in r.split()) for r in refs]
    results, _ = paired_bootstrap([("a", a), ("b", b)], refs, n_samples=300)
    assert results[1].note == "" and 1 / 301 < results[1].p_value < 1.0


def test_an_empty_hypothesis_file_is_refused_by_name(tmp_path):
    refs = _sentences(10, VOCAB, 0)
    empty = tmp_path / "b" / "generate-test.txt"
    with pytest.raises(DataError) as e:
        paired_bootstrap([("a", refs), ("b", [])], refs, paths=["a.txt", str(empty)])
    msg = str(e.value)
    assert msg.startswith(f"{empty}: ") and "empty" in msg and "task=generate" in msg


def test_all_empty_translations_against_a_zero_system_are_not_significant():
    refs = _sentences(60, VOCAB, 0)
    blank, unrelated = [""] * 60, _sentences(60, OTHER, 5)
    results, _ = paired_bootstrap([("blank", blank), ("unrelated", unrelated)], refs)
    assert results[0].bleu == results[1].bleu == 0.0
    assert results[1].p_value == 1.0 and results[1].note == "same BLEU"
