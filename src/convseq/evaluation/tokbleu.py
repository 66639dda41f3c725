"""Lowercased, tokenized BLEU against Multi30k's ``tok/`` references, as published papers report it.

Multi30k's ``tok/<split>.{de,en}`` were made with Moses:
``lowercase.perl | normalize-punctuation.perl -l L | tokenizer.perl -l L`` (XML escaping on:
``&apos;``, ``&quot;``, ``&amp;``). Published Multi30k BLEU is multi-bleu.perl over such files.
This module puts detokenised hypotheses (``generate-test.txt``) through the same pipeline with
sacremoses and scores them with sacreBLEU on the already-tokenised text (``tokenize='none'``),
which counts n-grams over whitespace-separated tokens as multi-bleu.perl does.

Two details make sacremoses reproduce the Moses scripts of the corpus (2016) line for line on
Multi30k's raw test, valid and train files (both languages):

- normalize-punctuation.perl reads each line with its newline, so its German/French rule that
  moves a final period out of quotes (``tea."`` -> ``tea".``) sees a character after the quote
  and fires at the end of a line; the line is given to sacremoses with its newline for that.
- that Moses version turned a standalone ``‘``, ``‚`` or ``’`` (not between letters) into ``"``;
  later Moses, and sacremoses, turn it into ``'``. The older rule is restored here.

CLI::

    python -m convseq.evaluation.tokbleu outputs/run/generate-test.txt data/multi30k/tok/test.en --lang en
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sacrebleu.metrics import BLEU, BLEUScore
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from convseq.errors import DataError
from convseq.evaluation.bootstrap import hypothesis_file, read_lines

__all__ = [
    "PIPELINE",
    "MosesPipeline",
    "TokBleu",
    "pipeline_matches",
    "score_files",
    "tok_bleu",
    "tokenize_lines",
]

PIPELINE = (
    "lowercase | normalize-punctuation.perl -l {lang} | tokenizer.perl -l {lang} (XML escaping), "
    "as sacremoses {version} MosesPunctNormalizer(lang={lang!r}) on the line with its newline and "
    'standalone ‘ ‚ ’ -> " (Moses 2016) + MosesTokenizer(lang={lang!r}).tokenize(escape=True, '
    "aggressive_dash_splits=False); BLEU: sacrebleu tokenize=none on both sides (multi-bleu.perl "
    "style)"
)
# Moses 2016 normalize-punctuation.perl: s/‘/\"/g; s/‚/\"/g; s/’/\"/g (after the between-letters
# rules); sacremoses follows later Moses, which writes ' instead.
_STANDALONE_SINGLE_QUOTES = ("‘", "‚", "’")


def _sacremoses_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sacremoses")
    except PackageNotFoundError:  # pragma: no cover - imported above, so installed
        return "?"


class MosesPipeline:
    """Lowercase, Moses punctuation normalisation and Moses tokenisation for one language.

    Args:
        lang: the language code Moses takes with ``-l`` (``en``, ``de``, ``fr``, ...).
    """

    def __init__(self, lang: str):
        self.lang = lang
        self.normalizer = MosesPunctNormalizer(lang=lang)
        replaced = 0
        subs = []
        for pattern, repl in self.normalizer.substitutions:
            if pattern in _STANDALONE_SINGLE_QUOTES and repl == "'":
                repl, replaced = '"', replaced + 1
            subs.append((pattern, repl))
        if replaced != len(_STANDALONE_SINGLE_QUOTES):
            raise RuntimeError(
                f"sacremoses {_sacremoses_version()}: the rules for standalone ‘ ‚ ’ were not found "
                "in MosesPunctNormalizer.substitutions; install sacremoses==0.1.1"
            )
        self.normalizer.substitutions = subs
        self.tokenizer = MosesTokenizer(lang=lang)

    def __call__(self, line: str) -> str:
        """The tokenised form of one detokenised line (no newline in it)."""
        if not line.strip():
            return ""  # tokenizer.perl prints a blank line as it is
        # the newline lets the "period out of quotes at line end" rule fire as in Moses
        text = self.normalizer.normalize(line.lower() + "\n")
        return self.tokenizer.tokenize(
            text, escape=True, aggressive_dash_splits=False, return_str=True
        )

    def describe(self) -> str:
        """The exact pipeline, in one line."""
        return PIPELINE.format(lang=self.lang, version=_sacremoses_version())


def tokenize_lines(lines: Iterable[str], lang: str) -> list[str]:
    """Each line through `MosesPipeline` for `lang`."""
    pipe = MosesPipeline(lang)
    return [pipe(line) for line in lines]


def tok_bleu(hypotheses_tok: Sequence[str], references_tok: Sequence[str]) -> BLEUScore:
    """Corpus BLEU of tokenised hypotheses against one tokenised reference each.

    Both sides are split on whitespace only (``tokenize='none'``); casing is compared as is.
    """
    if len(hypotheses_tok) != len(references_tok):
        raise ValueError(
            f"{len(hypotheses_tok)} hypotheses but {len(references_tok)} references: "
            "one hypothesis per reference line"
        )
    # force: the text is tokenised on purpose; sacrebleu would warn about it otherwise
    metric = BLEU(tokenize="none", force=True)
    return metric.corpus_score(list(hypotheses_tok), [list(references_tok)])


@dataclass
class TokBleu:
    """The result of `score_files`."""

    score: BLEUScore
    signature: str
    pipeline: str
    hypotheses: Path
    reference: Path
    lines: int

    def report(self) -> str:
        """The lines the CLI prints."""
        return "\n".join(
            [
                f"tokenized BLEU = {self.score.score:.2f}",
                f"details:    {self.score}",
                f"hypotheses: {self.hypotheses} ({self.lines} lines)",
                f"reference:  {self.reference} (tokenised, used as is)",
                f"pipeline:   {self.pipeline}",
                f"sacrebleu:  {self.signature}",
            ]
        )


def score_files(
    hypotheses: str | os.PathLike, reference_tok: str | os.PathLike, lang: str
) -> TokBleu:
    """Tokenised BLEU of a detokenised hypothesis file against a Moses-tokenised reference file.

    Args:
        hypotheses: one detokenised hypothesis per line, or a run folder with generate-test.txt.
        reference_tok: the tokenised reference (e.g. multi30k/tok/test.en), one line each.
        lang: the target language (Moses ``-l``).

    Raises:
        DataError: a file is missing or unreadable, or the line counts differ.
    """
    hyp_path = hypothesis_file(hypotheses)
    ref_path = Path(reference_tok)
    hyps = read_lines(hyp_path)
    refs = read_lines(ref_path)
    if len(hyps) != len(refs):
        raise DataError(
            f"{len(hyps)} hypothesis lines but {len(refs)} lines in the reference {ref_path}: "
            "give one translation per reference line, of the same split (test hypotheses "
            "against tok/test.<lang>)",
            path=str(hyp_path),
        )
    pipe = MosesPipeline(lang)
    metric = BLEU(tokenize="none", force=True)
    score = metric.corpus_score([pipe(h) for h in hyps], [refs])
    return TokBleu(
        score=score,
        signature=str(metric.get_signature()),
        pipeline=pipe.describe(),
        hypotheses=hyp_path,
        reference=ref_path,
        lines=len(hyps),
    )


def pipeline_matches(
    raw: str | os.PathLike, reference_tok: str | os.PathLike, lang: str
) -> tuple[int, list[tuple[int, str, str]]]:
    """How many lines of a raw file the pipeline turns exactly into the tokenised file's lines.

    Returns:
        (lines compared, mismatches as (1-based line, pipeline output, tokenised line)).

    Raises:
        DataError: the two files have different line counts.
    """
    raw_lines, tok_lines = read_lines(raw), read_lines(reference_tok)
    if len(raw_lines) != len(tok_lines):
        raise DataError(
            f"{len(raw_lines)} lines but {len(tok_lines)} in {reference_tok}", path=str(raw)
        )
    pipe = MosesPipeline(lang)
    bad = []
    for i, (r, t) in enumerate(zip(raw_lines, tok_lines), start=1):
        out = pipe(r)
        if out != t:
            bad.append((i, out, t))
    return len(raw_lines), bad


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m convseq.evaluation.tokbleu HYP_FILE REF_TOK_FILE --lang en``."""
    parser = argparse.ArgumentParser(
        prog="python -m convseq.evaluation.tokbleu",
        description="Lowercased Moses-tokenized BLEU (as published Multi30k numbers) of "
        "detokenised hypotheses against a Moses-tokenised reference.",
    )
    parser.add_argument("hypotheses", help="detokenised hypotheses, or a run folder")
    parser.add_argument("reference", help="tokenised reference, e.g. multi30k/tok/test.en")
    parser.add_argument("--lang", required=True, help="target language (Moses -l), e.g. en")
    args = parser.parse_args(argv)
    try:
        result = score_files(args.hypotheses, args.reference, args.lang)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result.report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
