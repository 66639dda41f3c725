"""How often validation BLEU runs (`bleu_every_n_epochs`), read from the real composed configs.

Unset (null, the default), it follows the metric the run goes by: every epoch when
best.ckpt or a sweep goes by valid/bleu, never otherwise. A period that would leave that metric
missing after a validation, 0 included, is refused with the keys to change.
"""

from __future__ import annotations

import pytest

from convseq.errors import DataError
from convseq.tasks.config import as_config
from convseq.training.bleu import wants_valid_bleu
from tests.conftest import compose_config

BY_LOSS = ["checkpoint.monitor=valid/loss", "checkpoint.mode=min", "optimized_metric=valid/loss"]


def _period(tmp_path, *overrides: str) -> int:
    return wants_valid_bleu(as_config(compose_config(list(overrides), output_dir=str(tmp_path))))


def test_unset_follows_the_metric_the_run_goes_by(tmp_path):
    assert _period(tmp_path) == 0  # the default run goes by the loss
    assert _period(tmp_path, "checkpoint.monitor=valid/bleu", "checkpoint.mode=max") == 1
    assert _period(tmp_path, "optimized_metric=valid/bleu") == 1
    assert _period(tmp_path, "bleu_every_n_epochs=3") == 3  # by the loss: any period


@pytest.mark.parametrize("experiment", ["multi30k_fconv", "multi30k_fast"])
def test_turning_bleu_off_in_a_bleu_recipe_is_refused_naming_the_keys(tmp_path, experiment):
    assert _period(tmp_path, f"experiment={experiment}") == 1
    with pytest.raises(DataError) as refused:
        _period(tmp_path, f"experiment={experiment}", "bleu_every_n_epochs=0")
    message = str(refused.value)
    assert message.startswith("bleu_every_n_epochs=0 turns validation BLEU off")
    assert "checkpoint.monitor=valid/bleu and optimized_metric=valid/bleu" in message
    assert (
        "checkpoint.monitor=valid/loss checkpoint.mode=min optimized_metric=valid/loss" in message
    )
    # what the message says to do works: the recipe by the loss, no BLEU
    assert _period(tmp_path, f"experiment={experiment}", "bleu_every_n_epochs=0", *BY_LOSS) == 0


def test_only_the_key_set_to_bleu_is_named(tmp_path):
    with pytest.raises(
        DataError, match=r"^bleu_every_n_epochs=0 .* but optimized_metric=valid/bleu needs"
    ):
        _period(tmp_path, "optimized_metric=valid/bleu", "bleu_every_n_epochs=0")
    with pytest.raises(
        DataError, match=r"^checkpoint.monitor=valid/bleu but bleu_every_n_epochs=2"
    ):
        _period(tmp_path, "checkpoint.monitor=valid/bleu", "bleu_every_n_epochs=2")


def test_the_refusal_comes_before_the_data_bin_is_built(tmp_path):
    from convseq.tasks.train import train

    missing = tmp_path / "no_corpus_here"
    cfg = as_config(
        compose_config(
            ["data.generator=null", f"data.dir={missing}", "checkpoint.monitor=valid/bleu"]
            + ["checkpoint.mode=max", "bleu_every_n_epochs=0"],
            output_dir=str(tmp_path / "run"),
        )
    )
    with pytest.raises(DataError, match="^bleu_every_n_epochs=0 turns validation BLEU off"):
        train(cfg)
    assert not missing.exists()
