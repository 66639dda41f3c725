"""The end-of-training test translation runs where the model trained, before Lightning's teardown.

`trainer.test` ends with the strategy's teardown, which moves the LightningModule to the CPU; a
translation made after it would run on the CPU whatever device trained. Here the teardown of the
test stage moves the module to the "meta" device (no data: any computation after it fails or
gives nothing), which stands in for "not the training device" on a CPU-only machine: the test
BLEU must still be there, and be the one of best.ckpt's weights.
"""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
from pytorch_lightning.strategies.strategy import Strategy
from pytorch_lightning.trainer.states import TrainerFn

from convseq.data.databin import DataBin
from convseq.evaluation.scores import corpus_scores
from convseq.inference.translator import Translator
from convseq.tasks.train import train
from tests.training_utils import summary, tiny_config


def test_test_bleu_is_computed_before_the_test_stage_moves_the_module_off_its_device(
    tiny_data, tmp_path, monkeypatch, one_thread
):
    teardown = Strategy.teardown
    moved = []

    def teardown_off_device(self: Strategy) -> None:
        module = self.lightning_module
        teardown(self)
        if isinstance(module, pl.LightningModule) and module.trainer.state.fn == TrainerFn.TESTING:
            module.to("meta")  # what the translation would find after trainer.test
            moved.append(True)

    monkeypatch.setattr(Strategy, "teardown", teardown_off_device)
    train(tiny_config(tiny_data, tmp_path, "trainer.max_epochs=1", "gen.max_len_b=12"))
    assert moved  # the test stage did tear down
    s = summary(tmp_path)
    assert s["test_device"] == "cpu"  # where the test translation ran: the training device
    lines = (tiny_data["corpus"] / "test.src").read_text().splitlines()
    refs = DataBin(tiny_data["databin"]).text("test", "tgt")
    hyps = Translator.from_checkpoints(s["best_checkpoint"]).translate(lines, max_len_b=12)
    assert s["test"]["test/bleu"] == pytest.approx(corpus_scores(hyps, refs).bleu)
    written = (tmp_path / "generate-test.txt").read_text().splitlines()
    assert written == hyps
