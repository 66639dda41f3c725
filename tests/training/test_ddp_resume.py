"""DDP on CPU (2 gloo processes, tests/ddp_script.py): exact resume, and BLEU shared by the ranks.

Two epochs with dropout and validation BLEU every epoch, three times: straight through; cut by a
SIGTERM to rank 0 in the middle of epoch 2; and resumed from that cut with ``resume=true``.

- The resumed run ends with the straight run's weights, bit for bit: each rank's own RNG state
  (dropout) is saved and restored, not rank 0's on every rank.
- Validation and test BLEU are translated by both ranks, each taking a share of the split's
  batches, and equal the figure one process computes from the same checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from convseq.data.databin import DataBin
from convseq.evaluation.scores import corpus_scores
from convseq.inference.translator import Translator
from tests.conftest import ROOT

RUN = ["trainer.max_epochs=2", "model.dropout=0.1", "bleu_every_n_epochs=1"]
GEN = ["gen.max_len_b=12", "gen.max_tokens=300", "checkpoint.keep_epochs=-1"]
CUT_AT = 13  # an update in the middle of epoch 2 (10 updates an epoch)


def ddp(tiny_data, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [
        sys.executable,
        str(ROOT / "tests" / "ddp_script.py"),
        str(tiny_data["corpus"]),
        str(tiny_data["cache"]),
        str(out),
        str(out.with_name(out.name + "_record")),
        *RUN,
        *GEN,
        *extra,
    ]
    proc = subprocess.run(cmd, cwd=out.parent, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def records(out: Path) -> list[dict]:
    folder = out.with_name(out.name + "_record")
    return [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory):
    work = tmp_path_factory.mktemp("ddp_resume")
    straight, cut = work / "straight", work / "cut"
    ddp(tiny_data, straight)
    ddp(tiny_data, cut, f"sigterm_at_step={CUT_AT}")
    interrupted = json.loads((cut / "summary.json").read_text())
    cut_records = records(cut)
    ddp(tiny_data, cut, "resume=true")
    return {
        "straight": straight,
        "cut": cut,
        "interrupted": interrupted,
        "cut_records": cut_records,
    }


def test_a_sigterm_mid_epoch_then_resume_ends_with_the_straight_runs_weights(runs):
    interrupted = runs["interrupted"]
    # the signal arrives after convseq's check of update CUT_AT: the next update ends the run
    assert interrupted["interrupted"] and interrupted["updates"] == CUT_AT + 1
    assert "SIGTERM during epoch 2" in interrupted["stop_reason"]
    assert [r["updates"] for r in runs["cut_records"]] == [CUT_AT + 1] * 2  # rank 1 stopped too
    a = torch.load(runs["straight"] / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(runs["cut"] / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 20
    for name, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][name]), name
    # dropout drew different numbers on the two ranks, so each rank's state had to be kept
    states = b["callbacks"]["RNGStateCallback"]["per_rank"]
    assert len(states) == 2 and not torch.equal(states[0]["torch"], states[1]["torch"])
    resumed = json.loads((runs["cut"] / "summary.json").read_text())
    straight = json.loads((runs["straight"] / "summary.json").read_text())
    keys = ("epoch", "updates", "valid/loss", "valid/bleu", "train_epoch/loss")
    assert [{k: h[k] for k in keys} for h in resumed["history"]] == [
        {k: h[k] for k in keys} for h in straight["history"]
    ]


def one_process_bleu(tiny_data, ckpt: Path, split: str) -> float:
    lines = (tiny_data["corpus"] / f"{split}.src").read_text().splitlines()
    refs = DataBin(tiny_data["databin"]).text(split, "tgt")
    # the run's settings (gen.max_tokens=300 too, so the batches are the run's own)
    hyps = Translator.from_checkpoints(ckpt).translate(lines, 300, beam=5, max_len_b=12)
    return corpus_scores(hyps, refs).bleu


def test_valid_and_test_bleu_are_shared_by_the_ranks_and_equal_one_processs(runs, tiny_data):
    out = runs["straight"]
    summary = json.loads((out / "summary.json").read_text())
    n_valid = len(DataBin(tiny_data["databin"]).text("valid", "tgt"))
    n_test = len(DataBin(tiny_data["databin"]).text("test", "tgt"))
    # two validations and the test split: each rank translated a part, together each sentence
    # once per translation (a rank translating the whole split would double the count)
    ids = [[i for b in r["translated"] for i in b] for r in records(out)]
    assert ids[0] and ids[1]
    assert sorted(ids[0] + ids[1]) == sorted([*range(n_valid)] * 2 + [*range(n_test)])
    for epoch, h in enumerate(summary["history"], start=1):
        ckpt = out / "checkpoints" / f"epoch{epoch:03d}.ckpt"
        assert h["valid/bleu"] == one_process_bleu(tiny_data, ckpt, "valid"), epoch
    best = Path(summary["best_checkpoint"])
    assert summary["test"]["test/bleu"] == one_process_bleu(tiny_data, best, "test")
    assert summary["test_device"] == "cpu"
