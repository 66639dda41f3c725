"""Training and generation on a fairseq-preprocess data-bin (`data=fairseq data.path=DIR`): the
same losses, bit for bit, and the same translations as on convseq's data-bin of the same corpus;
task=generate reads the checkpoint's fairseq data, scores against gen.reference, and refuses what
does not fit."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from convseq.data.databin import DataBin
from convseq.errors import DataError
from convseq.evaluation.history import read_metrics
from convseq.inference.errors import DataMismatchError
from convseq.tasks.config import GenerateTaskConfig
from convseq.tasks.generate import run_generate
from convseq.tasks.train import train
from tests.data.fairseq_layout import fairseq_copy
from tests.generation_utils import generate_config
from tests.training_utils import summary, tiny_config

# 3 epochs of 18 updates, each logged (enough to translate some words); no BLEU during training
SHORT = ["trainer.max_epochs=8", "trainer.log_every_n_steps=1", "gen.test_bleu=false"]
STEP_KEYS = ("train/loss", "train/nll_loss", "train/gnorm", "train/wpb", "train/bsz")


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory) -> dict[str, Path]:
    """One short run on convseq's tiny data-bin and one on the same data in fairseq's layout."""
    import torch

    base = tmp_path_factory.mktemp("fairseq_runs")
    folder = fairseq_copy(DataBin(tiny_data["databin"]), base / "data-bin")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(tiny_config(tiny_data, base / "convseq", *SHORT))
        train(
            tiny_config(tiny_data, base / "fairseq", *SHORT, "data=fairseq", f"data.path={folder}")
        )
    finally:
        torch.set_num_threads(threads)
    return {"convseq": base / "convseq", "fairseq": base / "fairseq", "folder": folder}


def steps(run: Path) -> list[dict]:
    rows = read_metrics(run / "csv" / "metrics.csv")
    return [{k: r[k] for k in ("step", *STEP_KEYS)} for r in rows if "train/loss" in r]


def test_training_losses_are_those_of_convseqs_data_bin_bit_for_bit(runs):
    mine, theirs = steps(runs["convseq"]), steps(runs["fairseq"])
    assert len(mine) == 144 and mine == theirs  # exact floats: the same batches and updates
    a, b = summary(runs["convseq"]), summary(runs["fairseq"])
    assert a["updates"] == b["updates"] == 144
    assert [h["valid/loss"] for h in a["history"]] == [h["valid/loss"] for h in b["history"]]


def test_the_translations_are_those_of_convseqs_data_bin(runs, tiny_data, tmp_path, one_thread):
    ref = tiny_data["corpus"] / "test.tgt"
    mine = run_generate(
        generate_config(tiny_data, tmp_path / "a", f"ckpt={runs['convseq']}", "gen.beam=2")
    )
    # data not given: the checkpoint's own, the fairseq folder it recorded
    cfg = generate_config(tiny_data, tmp_path / "b", f"ckpt={runs['fairseq']}", "gen.beam=2")
    theirs = run_generate(_not_given(cfg, reference=str(ref)))
    hyps = [(tmp_path / d / "generate-test.txt").read_text() for d in ("a", "b")]
    assert hyps[0] == hyps[1] and hyps[0].count("\n") == 40
    assert len(hyps[0].split()) > 200  # sentences of several words, not one token each
    # scored against the raw reference file, the figures are convseq's
    assert theirs["reference"] == str(ref)
    assert mine["scores"]["bleu"] > 0
    assert theirs["scores"]["bleu"] == mine["scores"]["bleu"]
    assert theirs["scores"]["chrf"] == mine["scores"]["chrf"]
    # against the references rebuilt from ids (unknown words read <unk>), they differ
    rebuilt = run_generate(_not_given(cfg, reference=None))
    assert rebuilt["scores"]["chrf"] != mine["scores"]["chrf"]


def test_the_checkpoint_records_the_fairseq_folder_and_generation_refuses_what_differs(
    runs, tiny_data, tmp_path, one_thread
):
    import torch

    ckpt = torch.load(runs["fairseq"] / "checkpoints" / "best.ckpt", weights_only=True)
    data = ckpt["datamodule_hyper_parameters"]["data"]
    assert (data["format"], data["path"]) == ("fairseq", str(runs["folder"]))
    assert (data["src_lang"], data["tgt_lang"]) == ("src", "tgt")  # read from the file names

    base = generate_config(tiny_data, tmp_path, f"ckpt={runs['fairseq']}")
    short = tmp_path / "short.txt"
    short.write_text("one line\n")
    with pytest.raises(DataError, match=r"gen.reference has 1 lines but fairseq data-bin split"):
        run_generate(_not_given(base, reference=str(short)))
    other_joiner = {**data, "remove_bpe": "subword_nmt"}
    with pytest.raises(DataMismatchError, match=r"data.remove_bpe: None vs 'subword_nmt'"):
        run_generate(dataclasses.replace(base, data=other_joiner))
    moved = {**data, "path": str(tmp_path / "gone")}
    with pytest.raises(DataMismatchError, match=r"give where it is here with data.path=FOLDER"):
        run_generate(_with_record(base, tmp_path, runs, moved))


def _not_given(cfg: GenerateTaskConfig, **gen: Any) -> GenerateTaskConfig:
    """`cfg` with no data on the command line (the checkpoint's own), `gen` keys changed."""
    return dataclasses.replace(cfg, data={}, gen=cfg.gen.updated(**gen))


def _with_record(
    base: GenerateTaskConfig, tmp_path: Path, runs: dict, data: dict
) -> GenerateTaskConfig:
    """A generate config over a copy of the fairseq run's checkpoint that records `data`."""
    import torch

    ckpt = torch.load(runs["fairseq"] / "checkpoints" / "best.ckpt", weights_only=True)
    ckpt["datamodule_hyper_parameters"]["data"] = data
    path = tmp_path / "moved.ckpt"
    torch.save(ckpt, path)
    return dataclasses.replace(base, ckpt=str(path), data={})
