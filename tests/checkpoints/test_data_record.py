"""A checkpoint's record of its training data reads as a data config of today, also when an
older version wrote it with settings since removed."""

from __future__ import annotations

from pathlib import Path

import torch

from convseq.checkpoints.data_record import DATA_HPARAMS, REMOVED, training_data
from convseq.data.preprocess import as_data_config

PRE_LAYOUT = Path(__file__).resolve().parents[1] / "fixtures" / "pre_layout" / "last.ckpt"


def test_a_removed_setting_is_left_out_of_the_record(tmp_path):
    old = torch.load(PRE_LAYOUT, weights_only=True)
    assert old[DATA_HPARAMS]["data"]["batch_tokens"] == 1000  # written before it moved
    data = training_data(old)
    assert data is not None and not set(REMOVED) & set(data)
    assert {k: v for k, v in old[DATA_HPARAMS]["data"].items() if k not in REMOVED} == data
    # what generation makes of it (the recorded corpus folder, or one given with data.dir=)
    cfg = as_data_config({**data, "dir": str(tmp_path)})
    assert (cfg.name, cfg.src_lang, cfg.tgt_lang) == ("toy", "src", "tgt")


def test_a_record_without_data_stays_none():
    assert training_data({}) is None
    assert training_data({DATA_HPARAMS: {"data": None}}) is None
