"""The time-to-quality recipe (conf/experiment/multi30k_fast.yaml): its settings, and (slow) two
epochs of it on Multi30k against the reported run.

    pytest -m slow tests/test_recipe_fast.py     # the Multi30k run: about 2 minutes on 2 cores
"""

from __future__ import annotations

import pytest

from convseq.common.config import plain as to_plain
from convseq.optim.warmup import UpdateSchedule
from convseq.tasks.config import as_config
from tests.conftest import compose_config
from tests.training_utils import QUIET, summary

# Valid loss (label-smoothed, base 2) after 2 epochs (268 updates) of the recipe, seed 1, in the
# reported run of docs/multi30k.md#time-to-quality (2-core Intel Xeon): 5.690. The margin is
# for other machines (the threads' summation order and the CPU's kernels differ).
VALID_LOSS_AFTER_2_EPOCHS = 5.69
MARGIN = 0.15


def test_the_recipe_is_the_small_fconv_with_adam_and_inverse_sqrt(tmp_path):
    typed = as_config(compose_config(["experiment=multi30k_fast"], output_dir=str(tmp_path)))
    cfg = to_plain(typed)
    study = to_plain(compose_config(["experiment=multi30k_compare"], output_dir=str(tmp_path)))
    assert cfg["model"] == study["model"] and cfg["data"] == study["data"]
    assert cfg["batching"] == study["batching"] and cfg["criterion"] == study["criterion"]
    optim = cfg["optim"]
    assert (optim["name"], optim["lr"], optim["betas"], optim["clip_norm"]) == (
        "adam",
        0.004,
        [0.9, 0.98],
        0.1,
    )
    schedule = UpdateSchedule(typed.anneal, lr=typed.optim.lr)
    assert schedule.lr_at(300) == pytest.approx(0.004)  # the warm-up's end: the peak
    assert schedule.lr_at(1200) == pytest.approx(0.002)  # then lr * sqrt(300 / update)
    assert schedule.finished(10**6) is None  # patience on valid BLEU ends the run
    assert cfg["patience"] == 10 and cfg["trainer"]["max_time"] is None
    assert cfg["checkpoint"]["monitor"] == "valid/bleu" and cfg["bleu_every_n_epochs"] == 1


@pytest.mark.slow
def test_two_epochs_of_the_recipe_learn_as_the_reported_run(shared_data, tmp_path, monkeypatch):
    from convseq.tasks.train import train

    monkeypatch.setenv("CONVSEQ_DATA_ROOT", str(shared_data))
    cfg = to_plain(
        compose_config(
            [
                "experiment=multi30k_fast",
                *QUIET,
                "trainer.max_epochs=2",
                "bleu_every_n_epochs=0",  # loss only
                "checkpoint.monitor=valid/loss",
                "checkpoint.mode=min",
                "optimized_metric=valid/loss",
                "final_test=false",
            ],
            output_dir=str(tmp_path),
        )
    )
    train(cfg)
    s = summary(tmp_path)
    assert s["updates"] == 268
    assert s["history"][-1]["valid/loss"] <= VALID_LOSS_AFTER_2_EPOCHS + MARGIN
