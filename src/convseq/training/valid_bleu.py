"""BLEU during training: the validation split translated every few epochs, logged as valid/bleu.

`model_scores` translates a split with a ConvSeqModule's weights (no Trainer, so it runs inside
training hooks too) and scores it with `convseq.evaluation.scores`; `ValidBleu` is the callback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytorch_lightning as pl

from convseq.errors import DataError
from convseq.evaluation.scores import Scores, corpus_scores
from convseq.inference.generation import translate_split
from convseq.inference.options import GenOptions
from convseq.inference.translator import translator_of

VALID_BLEU = "valid/bleu"


def model_scores(
    module: Any, databin: Any, split: str, gen: Mapping[str, Any] | None
) -> tuple[Scores, list[str]]:
    """BLEU/chrF of a ConvSeqModule translating ``split`` with the ``gen`` settings.

    Runs without a Trainer (inside training hooks too); the module's train/eval flags and
    weights come out unchanged. Returns the scores and the best hypotheses, in input order.
    """
    gen = dict(gen or {})
    translator = translator_of(module)
    hyps = translate_split(translator, databin, split, gen, GenOptions.from_mapping(gen))
    refs = databin.text(split, "tgt")
    return corpus_scores(hyps, refs, tokenize=str(gen.get("tokenize", "13a"))), hyps


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
