"""BLEU during training: the validation split every few epochs (valid/bleu), and the test split
and the extra test sets (`data.test_sets`) with the best checkpoint at the end (test/bleu).

`model_scores` translates a split with a ConvSeqModule's weights (no Trainer, so it runs inside
training hooks too) and scores it with `convseq.evaluation.scores`. Under DDP every rank
translates its share of the split's batches on its own device, the texts are gathered in input
order, rank 0 scores them once and every rank receives the figures: the one-process figures,
exactly (`convseq.inference.sharding`). `ValidBleu` and `TestBleu` are the callbacks; both run
inside Lightning's loop, so the module is still on the device that trained it.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

from convseq.common.distributed import rank_and_world
from convseq.data.databin import DataBin
from convseq.errors import DataError
from convseq.evaluation.scores import Scores, corpus_scores
from convseq.inference.generation import translate_split
from convseq.inference.options import GenConfig
from convseq.inference.sharding import broadcast_object
from convseq.inference.translator import translator_of
from convseq.training.config import TrainConfig

VALID_BLEU = "valid/bleu"


def model_scores(
    module: Any, databin: DataBin, split: str, gen: GenConfig
) -> tuple[Scores, list[str]]:
    """BLEU/chrF of a ConvSeqModule translating ``split`` with the ``gen`` settings.

    Runs without a Trainer (inside training hooks too); the module's train/eval flags and
    weights come out unchanged. Returns the scores and the best hypotheses, in input order.
    """
    translator = translator_of(module)
    hyps = translate_split(translator, databin, split, gen)
    rank, _ = rank_and_world()
    scores = None
    if rank == 0:  # scored once; the figures travel to the other ranks
        refs = databin.text(split, "tgt")
        scores = corpus_scores(hyps, refs, tokenize=gen.tokenize)
    return broadcast_object(scores), hyps


def wants_valid_bleu(cfg: TrainConfig) -> int:
    """Every how many epochs validation BLEU is computed (0: never).

    ``bleu_every_n_epochs``; unset (null), every epoch when ``checkpoint.monitor`` (``patience``
    watches the same key) or ``optimized_metric`` is ``valid/bleu``, else never. A period that
    would leave such a metric missing after a validation (0 included) is refused, naming the keys
    to change, rather than silently overridden.
    """
    every = cfg.bleu_every_n_epochs
    keys = [
        f"{key}={VALID_BLEU}"
        for key, value in (
            ("checkpoint.monitor", cfg.checkpoint.monitor),
            ("optimized_metric", cfg.optimized_metric),
        )
        if value == VALID_BLEU
    ]
    if not keys:
        return max(every or 0, 0)
    if every is None or every == 1:
        return 1
    if every <= 0:
        raise DataError(
            f"bleu_every_n_epochs={every} turns validation BLEU off, but {' and '.join(keys)} "
            f"needs it after every validation: set bleu_every_n_epochs=1 (or leave it unset), "
            f"or go by the loss: checkpoint.monitor=valid/loss checkpoint.mode=min "
            f"optimized_metric=valid/loss"
        )
    raise DataError(
        f"{' and '.join(keys)} but bleu_every_n_epochs={every}: the metric must exist after "
        f"every validation; set bleu_every_n_epochs=1"
    )


class ValidBleu(pl.Callback):
    """Translates the validation split every ``every`` epochs and logs ``valid/bleu``.

    The figure joins the epoch's validation record (logged, in the run's history), so
    ``checkpoint.monitor=valid/bleu checkpoint.mode=max`` keeps best.ckpt by BLEU. Under DDP
    the ranks share the translation and all receive the same figure (`model_scores`).

    Args:
        every: the period in epochs (1 = every validation).
        gen: the `gen` config group (beam, lenpen, max_tokens, ...).
    """

    def __init__(self, every: int, gen: GenConfig):
        self.every = int(every)
        self.gen = gen

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.every <= 0:
            return
        if (trainer.current_epoch + 1) % self.every != 0:
            return
        databin = trainer.datamodule.databin
        scores, _ = model_scores(pl_module, databin, "valid", self.gen)
        pl_module.valid_extra[VALID_BLEU] = scores.bleu


class TestBleu(pl.Callback):
    """At the end of ``trainer.test``: BLEU/chrF of the tested weights on the test split and on
    every extra test set of the data-bin (``data.test_sets``).

    Runs in the test loop's last hook, before Lightning's teardown moves the module to the CPU,
    so the translation runs on the device that trained (shared by the ranks under DDP). The
    results stay here for the caller: `scores` and `hypotheses` of the test split (in input
    order, every rank), `extra` (test set name -> (scores, hypotheses)), and `device` (where the
    translation ran, e.g. "cuda:0").

    Args:
        gen: the `gen` config group (beam, lenpen, max_tokens, ...).
    """

    __test__ = False  # not a pytest class, whatever its name

    def __init__(self, gen: GenConfig):
        self.gen = gen
        self.scores: Scores | None = None
        self.hypotheses: list[str] = []
        self.extra: dict[str, tuple[Scores, list[str]]] = {}
        self.device: str | None = None

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.fast_dev_run:
            return  # a smoke test: one batch, no full translation
        self.device = str(pl_module.device)
        databin = trainer.datamodule.databin
        self.scores, self.hypotheses = model_scores(pl_module, databin, "test", self.gen)
        self.extra = {
            name: model_scores(pl_module, databin, name, self.gen) for name in databin.test_sets
        }
