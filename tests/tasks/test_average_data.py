"""task=average keeps the data settings and segmentation of its inputs (so task=generate finds
its data without data=...), and refuses inputs trained on other data, or other than the data
given, naming them."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from convseq.checkpoints.data_record import DATA_HPARAMS
from convseq.checkpoints.io import TEXT_KEY
from convseq.common.config import PathsConfig
from convseq.errors import CheckpointError
from convseq.tasks.average import run_average
from convseq.tasks.config import AverageConfig, AverageTaskConfig
from convseq.tasks.generate import run_generate
from tests.generation_utils import generate_config, tiny_checkpoint


@pytest.fixture
def tiny_ckpt(tiny_data, tmp_path_factory):
    return tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())


def edited_checkpoint(src: Path, dst: Path, edit) -> Path:
    ckpt = torch.load(src, weights_only=True)
    edit(ckpt)
    torch.save(ckpt, dst)
    return dst


def average_cfg(ckpts: list[Path], out: Path, data: dict | None = None) -> AverageTaskConfig:
    """The typed config run.py hands task=average (data None: not given, the node empty)."""
    return AverageTaskConfig(
        ckpts=[str(c) for c in ckpts],
        average=AverageConfig(last_n=0, output=str(out)),
        paths=PathsConfig(output_dir=str(out.parent)),
        data=data or {},
    )


def test_an_averaged_checkpoint_carries_its_inputs_data_and_generates_without_data(
    tiny_data, tiny_ckpt, tmp_path, one_thread
):
    copy = shutil.copy(tiny_ckpt, tmp_path / "copy.ckpt")
    averaged = run_average(average_cfg([tiny_ckpt, copy], tmp_path / "avg.ckpt"))
    source = torch.load(tiny_ckpt, weights_only=True)
    result = torch.load(averaged, weights_only=True)
    assert result[DATA_HPARAMS] == source[DATA_HPARAMS]
    assert result[TEXT_KEY] == source[TEXT_KEY]

    cfg = generate_config(tiny_data, tmp_path / "gen", f"ckpt={averaged}")
    cfg = dataclasses.replace(cfg, data={})  # no data on the command line
    assert run_generate(cfg)["sentences"] == 40  # the tiny corpus's test set, found alone


def test_inputs_trained_on_other_data_are_refused_by_name(tiny_ckpt, tmp_path):
    def bpe(ckpt):
        ckpt[DATA_HPARAMS]["data"]["subword"]["type"] = "bpe"

    other = edited_checkpoint(tiny_ckpt, tmp_path / "other.ckpt", bpe)
    with pytest.raises(CheckpointError) as e:
        run_average(average_cfg([tiny_ckpt, other], tmp_path / "avg.ckpt"))
    assert f"{other} was trained on src->tgt (toy), {tiny_ckpt} on src->tgt (toy)" in str(e.value)
    assert "data.subword.type: 'none' vs 'bpe'" in str(e.value)

    def strip(ckpt):
        del ckpt[DATA_HPARAMS], ckpt[TEXT_KEY]

    bare = edited_checkpoint(tiny_ckpt, tmp_path / "bare.ckpt", strip)
    with pytest.raises(CheckpointError, match=f"{bare} records none"):
        run_average(average_cfg([tiny_ckpt, bare], tmp_path / "avg.ckpt"))
    assert not (tmp_path / "avg.ckpt").exists()


def test_data_given_to_average_must_be_the_inputs(tiny_ckpt, tmp_path):
    copy = shutil.copy(tiny_ckpt, tmp_path / "copy.ckpt")
    data = torch.load(tiny_ckpt, weights_only=True)[DATA_HPARAMS]["data"]
    flipped = {**data, "src_lang": "tgt", "tgt_lang": "src"}
    with pytest.raises(CheckpointError, match=r"trained on src->tgt \(toy\), but the data given"):
        run_average(average_cfg([tiny_ckpt, copy], tmp_path / "avg.ckpt", flipped))
    assert run_average(average_cfg([tiny_ckpt, copy], tmp_path / "avg.ckpt", data)).is_file()
