"""BLEU: corpus BLEU and chrF with sacreBLEU (with their signatures), and BLEU during training.

Hypotheses are detokenised text and references the raw (stripped) reference file of the split,
so the figures are comparable with any other system scored by sacreBLEU with the same signature.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytorch_lightning as pl
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


# ---------------------------------------------------------------------------- BLEU in training

VALID_BLEU = "valid/bleu"


def model_scores(
    module: Any, databin: Any, split: str, gen: Mapping[str, Any] | None
) -> tuple[Scores, list[str]]:
    """BLEU/chrF of a ConvSeqModule translating ``split`` with the ``gen`` settings.

    Runs without a Trainer (inside training hooks too); the module's train/eval flags and
    weights come out unchanged. Returns the scores and the best hypotheses, in input order.
    """
    from convseq.generate import split_scores  # local: generate imports this module
    from convseq.translator import GenOptions, translator_of

    gen = dict(gen or {})
    translator = translator_of(module)
    return split_scores(translator, databin, split, gen, GenOptions.from_mapping(gen))


def wants_valid_bleu(cfg: Mapping[str, Any]) -> int:
    """Every how many epochs validation BLEU is computed (0: never).

    ``bleu_every_n_epochs``, or every epoch when ``checkpoint.monitor`` (or ``patience``'s
    metric, the same key) is ``valid/bleu`` and no period is set.
    """
    every = int(cfg.get("bleu_every_n_epochs") or 0)
    monitor = (cfg.get("checkpoint") or {}).get("monitor")
    if monitor == VALID_BLEU or cfg.get("optimized_metric") == VALID_BLEU:
        if every > 1:
            raise DataError(
                f"checkpoint.monitor / optimized_metric is {VALID_BLEU} but bleu_every_n_epochs="
                f"{every}: the metric must exist after every validation; set bleu_every_n_epochs=1"
            )
        return 1
    return max(every, 0)


class ValidBleu(pl.Callback):
    """Translates the validation split every ``every`` epochs and logs ``valid/bleu``.

    The figure joins the epoch's validation record (logged, in the run's history), so
    ``checkpoint.monitor=valid/bleu checkpoint.mode=max`` keeps best.ckpt by BLEU. Under DDP
    every rank translates the whole split (no collective, the same figure everywhere).

    Args:
        every: the period in epochs (1 = every validation).
        gen: the `gen` config group (beam, lenpen, max_tokens, ...).
    """

    def __init__(self, every: int, gen: Mapping[str, Any] | None):
        self.every = int(every)
        self.gen = dict(gen or {})

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.every <= 0:
            return
        if (trainer.current_epoch + 1) % self.every != 0:
            return
        databin = trainer.datamodule.databin
        scores, _ = model_scores(pl_module, databin, "valid", self.gen)
        pl_module.valid_extra[VALID_BLEU] = scores.bleu
