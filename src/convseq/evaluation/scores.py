"""Corpus BLEU and chrF with sacreBLEU, with their signatures.

Hypotheses are detokenised text and references the raw (stripped) reference file of the split,
so the figures are comparable with any other system scored by sacreBLEU with the same signature.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF

from convseq.errors import DataError


@dataclass(frozen=True)
class Scores:
    """Corpus BLEU and chrF of a set of hypotheses.

    Attributes:
        bleu: BLEU (0-100).
        chrf: chrF2 (0-100).
        bleu_signature: sacreBLEU's signature of the BLEU settings.
        chrf_signature: sacreBLEU's signature of the chrF settings.
        bleu_line: sacreBLEU's one-line BLEU report (n-gram precisions, brevity penalty).
        chrf_line: sacreBLEU's one-line chrF report.
        sentences: number of hypothesis/reference pairs scored.
    """

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    bleu_line: str
    chrf_line: str
    sentences: int

    def lines(self) -> list[str]:
        """The report printed after generation: BLEU with its signature, then chrF with its own."""
        return [
            f"{self.bleu_signature} = {self.bleu_line.removeprefix('BLEU = ')}",
            f"{self.chrf_signature} = {self.chrf_line.split(' = ', 1)[-1]}",
        ]

    def as_dict(self) -> dict[str, float | str | int]:
        """Plain values (for JSON files and summaries)."""
        return {
            "bleu": self.bleu,
            "chrf": self.chrf,
            "bleu_signature": self.bleu_signature,
            "chrf_signature": self.chrf_signature,
            "bleu_line": self.bleu_line,
            "chrf_line": self.chrf_line,
            "sentences": self.sentences,
        }


def corpus_scores(
    hypotheses: Sequence[str],
    references: Sequence[str],
    tokenize: str = "13a",
    lowercase: bool = False,
) -> Scores:
    """sacreBLEU's corpus BLEU and chrF of ``hypotheses`` against one reference each.

    Args:
        hypotheses: detokenised system outputs, in reference order.
        references: the reference lines (raw text, stripped), one per hypothesis.
        tokenize: sacreBLEU's tokenizer (``13a``, its default; ``none`` for pre-tokenised text).
        lowercase: case-insensitive BLEU.

    Raises:
        DataError: the two lists differ in length or are empty.
    """
    if len(hypotheses) != len(references):
        raise DataError(
            f"{len(hypotheses)} hypotheses for {len(references)} references: BLEU needs one "
            "hypothesis per reference line"
        )
    if not hypotheses:
        raise DataError("no sentence to score: the split is empty")
    hyps, refs = [str(h) for h in hypotheses], [[str(r) for r in references]]
    bleu = BLEU(tokenize=tokenize, lowercase=lowercase)
    chrf = CHRF()
    b = bleu.corpus_score(hyps, refs)
    c = chrf.corpus_score(hyps, refs)
    return Scores(
        bleu=float(b.score),
        chrf=float(c.score),
        bleu_signature=f"BLEU|{bleu.get_signature()}",
        chrf_signature=f"chrF2|{chrf.get_signature()}",
        bleu_line=str(b),
        chrf_line=str(c),
        sentences=len(hyps),
    )
