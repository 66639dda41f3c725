"""convseq.evaluation.tokbleu: the Moses pipeline of Multi30k's tok/ files, and BLEU over tokenised text."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import sacrebleu

from convseq.errors import DataError
from convseq.evaluation.tokbleu import MosesPipeline, main, pipeline_matches, score_files, tok_bleu
from tests.conftest import missing_multi30k, multi30k_dir

MULTI30K = multi30k_dir()


# Expected forms written out by hand from the Moses rules (lowercase.perl,
# normalize-punctuation.perl -l L, tokenizer.perl -l L with XML escaping).
@pytest.mark.parametrize(
    ("lang", "raw", "tokenised"),
    [
        # English clitics: the apostrophe goes with what follows, escaped
        ("en", "The dog's ball isn't red.", "the dog &apos;s ball isn &apos;t red ."),
        # English "quote." style moves the period inside; & and " escaped
        ("en", 'Tom & Jerry, "Friends".', "tom &amp; jerry , &quot; friends . &quot;"),
        # brackets and ! split off; an intra-word hyphen stays (no aggressive dash splitting)
        ("en", "A well-known man (age 30) runs!", "a well-known man ( age 30 ) runs !"),
        # German: every apostrophe is a token of its own
        ("de", "Peter's Hund.", "peter &apos; s hund ."),
        # German quotes; the period leaves the quote at the end of the line (Moses reads the newline)
        ("de", "Er sagt: „Komm.“", "er sagt : &quot; komm &quot; ."),
        # a standalone ’ becomes " (Moses 2016, as in tok/train.de line 7090)
        (
            "de",
            "Ein Mann macht das „Hook ’em Horns“-Zeichen. ",
            "ein mann macht das &quot; hook &quot; em horns &quot; -zeichen .",
        ),
        # ’ between letters is an apostrophe; "s." keeps its period: single letters are German
        # non-breaking prefixes (tok/train.de line 14912 ends "mcdonald &apos; s.")
        ("de", "Schild von McDonald’s.", "schild von mcdonald &apos; s."),
        ("en", "   ", ""),
    ],
)
def test_pipeline_by_hand(lang: str, raw: str, tokenised: str) -> None:
    assert MosesPipeline(lang)(raw) == tokenised


def test_identical_scores_100_and_casing_ignored(tmp_path: Path) -> None:
    refs = ["the dog &apos;s ball isn &apos;t red .", "a man in a blue shirt ."]
    (tmp_path / "ref.tok").write_text("\n".join(refs) + "\n", encoding="utf-8")
    (tmp_path / "hyp.txt").write_text(
        "THE DOG'S BALL ISN'T RED.\nA man in a blue shirt.\n", encoding="utf-8"
    )
    result = score_files(tmp_path / "hyp.txt", tmp_path / "ref.tok", "en")
    assert result.score.score == pytest.approx(100.0)
    assert result.lines == 2
    assert "tok:none" in result.signature


def test_perturbed_hypothesis_matches_hand_computed_bleu(tmp_path: Path) -> None:
    ref = "a man in a blue shirt ."
    (tmp_path / "ref.tok").write_text(ref + "\n", encoding="utf-8")
    (tmp_path / "hyp.txt").write_text("A man in a red shirt.\n", encoding="utf-8")
    got = score_files(tmp_path / "hyp.txt", tmp_path / "ref.tok", "en").score.score
    # modified n-gram precisions of "a man in a red shirt ." against the reference: 1-grams 6/7,
    # 2-grams 4/6, 3-grams 2/5, 4-grams 1/4; same length, so no brevity penalty
    by_hand = 100 * math.exp(sum(math.log(p) for p in (6 / 7, 4 / 6, 2 / 5, 1 / 4)) / 4)
    assert got == pytest.approx(by_hand, abs=1e-9)
    assert got == pytest.approx(48.8923, abs=1e-3)
    hand_tokenised = sacrebleu.corpus_bleu(["a man in a red shirt ."], [[ref]], tokenize="none")
    assert got == pytest.approx(hand_tokenised.score, abs=1e-9)
    assert tok_bleu(["a man in a red shirt ."], [ref]).score == pytest.approx(by_hand, abs=1e-9)


def test_line_count_mismatch_names_the_files(tmp_path: Path) -> None:
    (tmp_path / "ref.tok").write_text("a .\nb .\nc .\n", encoding="utf-8")
    (tmp_path / "hyp.txt").write_text("A.\nB.\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        score_files(tmp_path / "hyp.txt", tmp_path / "ref.tok", "en")
    message = str(err.value)
    assert str(tmp_path / "hyp.txt") in message and str(tmp_path / "ref.tok") in message
    assert "2 hypothesis lines but 3 lines" in message
    assert err.value.path == str(tmp_path / "hyp.txt")


def test_run_folder_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "generate-test.txt").write_text("A man in a red shirt.\n", encoding="utf-8")
    (tmp_path / "ref.tok").write_text("a man in a blue shirt .\n", encoding="utf-8")
    assert main([str(run), str(tmp_path / "ref.tok"), "--lang", "en"]) == 0
    out = capsys.readouterr().out
    assert "tokenized BLEU = 48.89" in out
    assert str(run / "generate-test.txt") in out
    assert "normalize-punctuation.perl -l en" in out and "tokenize=none" in out
    (tmp_path / "two.tok").write_text("a .\nb .\n", encoding="utf-8")
    assert main([str(run), str(tmp_path / "two.tok"), "--lang", "en"]) == 2
    err = capsys.readouterr().err
    assert "1 hypothesis lines but 2 lines" in err and str(tmp_path / "two.tok") in err


def test_missing_generate_file_in_run_folder(tmp_path: Path) -> None:
    (tmp_path / "ref.tok").write_text("a .\n", encoding="utf-8")
    with pytest.raises(DataError, match="no generate-test.txt"):
        score_files(tmp_path, tmp_path / "ref.tok", "en")


def _multi30k(split: str, lang: str) -> tuple[Path, Path]:
    raw, tok = MULTI30K / f"{split}.{lang}", MULTI30K / "tok" / f"{split}.{lang}"
    reason = missing_multi30k(f"{split}.{lang}", f"tok/{split}.{lang}")
    if reason is not None:
        pytest.skip(reason)
    return raw, tok


@pytest.mark.parametrize("split", ["test", "valid"])
@pytest.mark.parametrize("lang", ["en", "de"])
def test_multi30k_raw_through_pipeline_is_tok(split: str, lang: str) -> None:
    raw, tok = _multi30k(split, lang)
    lines, mismatches = pipeline_matches(raw, tok, lang)
    assert lines == {"test": 1000, "valid": 1014}[split]
    assert mismatches == []
    assert score_files(raw, tok, lang).score.score == pytest.approx(100.0)


@pytest.mark.slow
@pytest.mark.parametrize("lang", ["en", "de"])
def test_multi30k_train_raw_through_pipeline_is_tok(lang: str) -> None:
    raw, tok = _multi30k("train", lang)
    lines, mismatches = pipeline_matches(raw, tok, lang)
    assert (lines, mismatches) == (29000, [])
