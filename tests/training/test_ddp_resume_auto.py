"""resume=auto under DDP (CPU, 2 gloo processes): both ranks take the same decision.

The same command twice, as a requeued job script runs it: in a fresh folder (holding only what
Hydra writes before the task) both ranks start a new run, which a SIGTERM to rank 0 cuts in the
middle of epoch 2; then both ranks continue from last.ckpt (resume=true's file, whose exact
resume under DDP tests/training/test_ddp_resume.py checks) to the end. A disagreement between ranks is refused with the ranks' choices named.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from convseq.errors import CheckpointError
from convseq.training.resume_agreement import check_agreement
from tests.training_utils import ddp_script_command, launch_env

PER_EPOCH = 10  # tests/ddp_script.py's batches: 19 an epoch, 10 a rank (one dummy)


def ddp(tiny_data, out: Path, *extra: str) -> dict:
    """tests/ddp_script.py (2 ranks, 2 epochs) with `extra` overrides; its summary.json."""
    record = out.with_name(out.name + "_record")
    cmd = ddp_script_command(
        tiny_data, out, record, "trainer.max_epochs=2", "model.dropout=0.1", *extra
    )
    proc = subprocess.run(
        cmd, cwd=out.parent, env=launch_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "summary.json").read_text())


def records(out: Path) -> list[dict]:
    folder = out.with_name(out.name + "_record")
    return [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


# slow: the default run covers resume=auto in one process (tests/tasks/test_resume_auto.py) and a
# DDP run's bit-exact resume (tests/training/test_ddp_resume.py)
@pytest.mark.slow
def test_resume_auto_starts_then_continues_on_every_rank(tiny_data, tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)  # what Hydra writes before the task starts
    (run / "run.log").write_text("")

    cut_at = PER_EPOCH + 3  # in the middle of epoch 2
    first = ddp(tiny_data, run, "resume=auto", f"sigterm_at_step={cut_at}")
    assert first["resumed_from"] is None and first["signal"] == "SIGTERM"
    assert first["stopped_at"] == {
        "epoch": 2,
        "epoch_updates_done": 4,
        "epoch_updates": PER_EPOCH,
        "updates": cut_at + 1,
        "mid_epoch": True,
    }
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)

    done = ddp(tiny_data, run, "resume=auto")
    assert done["resumed_from"] == str(run / "checkpoints" / "last.ckpt")
    assert done["signal"] is None and done["epochs"] == 2
    for r in records(run):  # both ranks started from the checkpoint and ran to the end
        assert r["updates"] == 2 * PER_EPOCH, r["rank"]
        for name, value in r["init"].items():
            assert torch.equal(value, saved["state_dict"][f"model.{name}"]), (r["rank"], name)
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 20


def test_ranks_that_chose_differently_are_refused_by_name():
    check_agreement(["/r/checkpoints/last.ckpt"] * 2, "auto")
    check_agreement([None, None], "auto")
    with pytest.raises(CheckpointError) as e:
        check_agreement(["/r/checkpoints/last.ckpt", None], "auto")
    message = str(e.value)
    assert message.startswith("resume=auto: the ranks found different checkpoints")
    assert "rank 0: /r/checkpoints/last.ckpt" in message
    assert "rank 1: no checkpoint (new run)" in message and "hydra.run.dir" in message
