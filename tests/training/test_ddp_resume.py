"""DDP on CPU (2 gloo processes): exact resume, BLEU shared by the ranks, and run.py trainer=ddp.

Two epochs with dropout and validation BLEU every epoch, three times: straight through; cut by a
SIGTERM to rank 0 in the middle of epoch 2; and resumed from that cut with ``resume=true``. The
first two are one launch (tests/ddp_script.py's ``--then``), the resumed run a fresh one.

- The resumed run ends with the straight run's weights, bit for bit: each rank's own RNG state
  (dropout) is saved and restored, not rank 0's on every rank.
- Validation and test BLEU are translated by both ranks, each taking a share of the split's
  batches, and equal the figure one process computes from the same checkpoint.
- `python run.py trainer=ddp trainer.accelerator=cpu` (Hydra relaunches rank 1), SIGTERM'd from
  outside early in epoch 2 and resumed, ends with the compose runs' weights; one folder, rank 0's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from convseq.data.databin import DataBin
from tests.conftest import run_folder_names
from tests.training.run_py import (
    GEN,
    RUN,
    assert_same_weights,
    finish,
    one_process_bleu,
    signal_in_epoch_2,
    start,
)
from tests.training_utils import ddp_script_command, launch_env

# updates an epoch per rank in the straight run (test_a_sigterm_... checks it): the cut run
# starts in the same launch, so its step is given before the straight run's summary exists
PER_EPOCH = 22


def ddp(tiny_data, out: Path, *extra: str, then: tuple[tuple[Path, list[str]], ...] = ()) -> None:
    """One launch of tests/ddp_script.py with the runs' settings: a run in `out` with `extra`,
    then, in the same launch, one in each folder of `then` with its own overrides (each run
    keeps its records in `<folder>_record`)."""
    env = launch_env()
    cmd = ddp_script_command(
        tiny_data, out, out.with_name(out.name + "_record"), *RUN, *GEN, *extra
    )
    for folder, more in then:
        record = folder.with_name(folder.name + "_record")
        cmd += ["--then", str(folder), str(record), *RUN, *GEN, *more]
    proc = subprocess.run(cmd, cwd=out.parent, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


def records(out: Path) -> list[dict]:
    folder = out.with_name(out.name + "_record")
    return [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory):
    work = tmp_path_factory.mktemp("ddp_resume")
    straight, cut = work / "straight", work / "cut"
    cut_at = PER_EPOCH + 3  # in the middle of epoch 2
    ddp(tiny_data, straight, then=((cut, [f"sigterm_at_step={cut_at}"]),))
    per_epoch = json.loads((straight / "summary.json").read_text())["history"][0]["updates"]
    interrupted = json.loads((cut / "summary.json").read_text())
    cut_records = records(cut)
    ddp(tiny_data, cut, "resume=true")
    return {
        "straight": straight,
        "cut": cut,
        "cut_at": cut_at,
        "per_epoch": per_epoch,
        "interrupted": interrupted,
        "cut_records": cut_records,
    }


def test_a_sigterm_mid_epoch_then_resume_ends_with_the_straight_runs_weights(runs):
    interrupted, cut_at = runs["interrupted"], runs["cut_at"]
    assert cut_at == runs["per_epoch"] + 3  # the straight run's epoch: 3 updates into epoch 2
    # the signal arrives after convseq's check of update cut_at: the next update ends the run
    assert interrupted["interrupted"] and interrupted["updates"] == cut_at + 1
    assert "SIGTERM during epoch 2" in interrupted["stop_reason"]
    assert [r["updates"] for r in runs["cut_records"]] == [cut_at + 1] * 2  # rank 1 stopped too
    a = torch.load(runs["straight"] / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(runs["cut"] / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] > runs["cut_at"] + 1
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


# -- the command users type: python run.py trainer=ddp ... ---------------------------------------
def run_py(tiny_data, out: Path, *extra: str) -> subprocess.Popen:
    """run.py with the compose runs' settings; Lightning re-runs it (through Hydra) for rank 1."""
    env = launch_env(CONVSEQ_CACHE=str(tiny_data["cache"]))
    return start(tiny_data, out, "trainer=ddp", "trainer.accelerator=cpu", *extra, env=env)


def test_run_py_trainer_ddp_trains_two_ranks_into_rank_0s_folder(tiny_data, tmp_path):
    out = tmp_path / "run"
    printed = finish(run_py(tiny_data, out, "max_update=4", "final_test=false"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 4 and not summary["interrupted"]
    assert "GLOBAL_RANK: 1" in (out / "train_ddp_process_1.log").read_text()
    assert {".hydra", "checkpoints", "summary.json", "train_ddp_process_1.log"} <= set(
        run_folder_names(out)
    )
    assert list(tmp_path.iterdir()) == [out]  # rank 1 (relaunched through Hydra) made no folder
    assert printed.count(" 4 updates in ") == 1, printed  # the summary line, rank 0's alone


# slow: the default run covers DDP's SIGTERM and bit-exact resume (the tests above, through
# tests/ddp_script.py) and run.py's DDP launch (the test above)
@pytest.mark.slow
def test_run_py_trainer_ddp_sigterm_and_resume_end_with_the_compose_runs_weights(
    runs, tiny_data, tmp_path
):
    out = tmp_path / "run"
    proc = run_py(tiny_data, out)
    signal_in_epoch_2(proc, out)  # SIGTERM to rank 0 only, as `kill PID` does
    printed = finish(proc, 75)  # cut short by a signal: EX_TEMPFAIL
    interrupted = json.loads((out / "summary.json").read_text())
    assert interrupted["interrupted"], interrupted["stop_reason"]
    assert "SIGTERM during epoch 2" in interrupted["stop_reason"]

    printed += finish(run_py(tiny_data, out, "resume=true"))
    assert_same_weights(runs["straight"], out)

    # one run folder, written by rank 0; rank 1 (relaunched by Lightning through Hydra, with
    # hydra.output_subdir=null) keeps only its own log there
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["interrupted"] and summary["resumed_from"]
    rank0 = [".hydra", "checkpoints", "csv", "generate-test.txt", "run.log", "summary.json"]
    assert run_folder_names(out) == sorted([*rank0, "train_ddp_process_1.log"])
    assert "GLOBAL_RANK: 1" in (out / "train_ddp_process_1.log").read_text()
    assert list(tmp_path.iterdir()) == [out]  # rank 1 made no folder of its own
    assert printed.count("convseq: 2 epochs") == 1
    # validation BLEU of the two ranks together: the one-process figure of each epoch's weights
    for epoch, h in enumerate(summary["history"], start=1):
        ckpt = out / "checkpoints" / f"epoch{epoch:03d}.ckpt"
        assert h["valid/bleu"] == one_process_bleu(tiny_data, ckpt, "valid"), epoch
