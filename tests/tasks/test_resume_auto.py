"""resume=auto: one command for a first launch and every requeue; where an interrupted run stopped.

- In a fresh folder (even one holding Hydra's .hydra/ and run.log) it trains from scratch.
- After a finished run, or one cut by SIGTERM in the middle of an epoch, it continues from
  checkpoints/last.ckpt and ends bit for bit where a run that was never stopped ends.
- A misspelt value fails with the accepted values listed.
- The summary line and summary.json of an interrupted run say where it stopped.
"""

from __future__ import annotations

import os
import signal

import pytest
import pytorch_lightning as pl
import torch

from convseq.checkpoints.io import resolve_resume
from convseq.errors import CheckpointError
from convseq.tasks import train as train_task
from convseq.tasks.train import train
from convseq.training.interruption import EX_TEMPFAIL
from tests.training_utils import last_checkpoint, summary, tiny_config

COMMON = ["model.dropout=0.2", "anneal=force", "anneal.force_anneal=3"]


class SigtermAt(pl.Callback):
    """Sends SIGTERM to this process once, after the batch that ends update `at`."""

    def __init__(self, at: int):
        self.at, self.sent = at, False

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.at and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)


def _train(tiny_data, out, *overrides, callbacks=None):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(tiny_config(tiny_data, out, *COMMON, *overrides), callbacks=callbacks)
    finally:
        torch.set_num_threads(before)


def _same_weights(a, b) -> None:
    ca, cb = last_checkpoint(a), last_checkpoint(b)
    assert ca["global_step"] == cb["global_step"]
    for name, tensor in ca["state_dict"].items():
        assert torch.equal(tensor, cb["state_dict"][name]), name
    oa, ob = ca["optimizer_states"][0]["state"], cb["optimizer_states"][0]["state"]
    for pid, state in oa.items():
        for key, value in state.items():
            assert torch.equal(value, ob[pid][key]), (pid, key)


@pytest.fixture(scope="module")
def straight(tiny_data, tmp_path_factory):
    """Three epochs never stopped (epoch 3 at a lower lr): what every continued run must end as."""
    out = tmp_path_factory.mktemp("straight")
    _train(tiny_data, out, "trainer.max_epochs=3")
    return out


def test_auto_in_a_fresh_folder_with_hydra_files_trains_from_scratch(tiny_data, tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("task: train\n")
    (tmp_path / "run.log").write_text("")
    assert resolve_resume("auto", tmp_path) is None
    _train(tiny_data, tmp_path, "trainer.max_epochs=1", "resume=auto")
    s = summary(tmp_path)
    assert s["resumed_from"] is None and s["epochs"] == 1 and s["updates"] == 18
    assert s["signal"] is None and s["exit_status"] == 0 and s["continue_with"] is None
    assert s["stopped_at"] == {
        "epoch": 1,
        "epoch_updates_done": 18,
        "epoch_updates": 18,
        "updates": 18,
        "mid_epoch": False,
    }


def test_auto_after_a_finished_run_continues_it_like_resume_true(tiny_data, straight, tmp_path):
    _train(tiny_data, tmp_path, "trainer.max_epochs=2", "resume=auto")
    assert summary(tmp_path)["resumed_from"] is None
    _train(tiny_data, tmp_path, "trainer.max_epochs=3", "resume=auto")
    s = summary(tmp_path)
    assert s["resumed_from"] == str(tmp_path / "checkpoints" / "last.ckpt")
    assert [h["epoch"] for h in s["history"]] == [1, 2, 3]
    assert [h["train_epoch/lr"] for h in s["history"]] == pytest.approx([0.25, 0.25, 0.025])
    _same_weights(straight, tmp_path)


def test_auto_after_a_sigterm_mid_epoch_continues_it_bit_exactly(
    tiny_data, straight, tmp_path, capsys
):
    _train(tiny_data, tmp_path, "trainer.max_epochs=3", "resume=auto", callbacks=[SigtermAt(25)])
    first = summary(tmp_path)
    # seen after update 25, saved after update 26: 8 of epoch 2's 18 updates
    assert first["interrupted"] and first["signal"] == "SIGTERM"
    assert first["exit_status"] == EX_TEMPFAIL and "resume=auto" in first["continue_with"]
    assert first["stopped_at"] == {
        "epoch": 2,
        "epoch_updates_done": 8,
        "epoch_updates": 18,
        "updates": 26,
        "mid_epoch": True,
    }
    valid = first["last_validation"]
    assert valid["epoch"] == 1 and valid["updates"] == 18
    assert valid["valid/loss"] == first["history"][0]["valid/loss"]
    assert first["test"] == {}  # the run that finishes it tests

    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("convseq: inter")]
    assert len(line) == 1, line
    assert line[0].startswith(
        "convseq: interrupted by SIGTERM in epoch 2 at update 8 of 18 (26 overall) after "
    )
    assert f"last valid/loss {valid['valid/loss']:.4f} (epoch 1, update 18)" in line[0]
    assert "continue it with resume=auto" in line[0] and str(tmp_path) in line[0]
    assert "0 epochs" not in line[0] and "None" not in line[0]

    _train(tiny_data, tmp_path, "trainer.max_epochs=3", "resume=auto")
    s = summary(tmp_path)
    assert s["resumed_from"] == str(tmp_path / "checkpoints" / "last.ckpt")
    assert s["signal"] is None and s["exit_status"] == 0 and s["test"]
    _same_weights(straight, tmp_path)


def test_a_misspelt_resume_lists_the_accepted_values(tiny_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for typo, hint in (("atuo", "did you mean resume=auto?"), ("maybe", "")):
        with pytest.raises(CheckpointError) as e:
            resolve_resume(typo, tmp_path)
        message = str(e.value)
        assert message.startswith(f"resume={typo}: ") and hint in message
        for word in ("false", "true", "auto", "checkpoint file", "run folder"):
            assert word in message
    # the value as the command line gives it, through Hydra and the schema
    cfg = tiny_config(tiny_data, tmp_path / "run", "resume=atuo")
    with pytest.raises(CheckpointError, match=r"resume=atuo: .*did you mean resume=auto"):
        train(cfg)
    assert not (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()


def test_auto_and_true_name_the_same_checkpoint(tmp_path):
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.parent.mkdir()
    last.write_bytes(b"")
    assert resolve_resume("auto", tmp_path) == resolve_resume(True, tmp_path) == last
    assert resolve_resume("AUTO", tmp_path) == last


def test_run_train_exits_75_after_a_signal_except_in_a_multirun(monkeypatch):
    cut = {"signal": "SIGTERM", "best_value": 3.5}
    monkeypatch.setattr(train_task, "_train", lambda cfg, callbacks: dict(cut))
    with pytest.raises(SystemExit) as e:
        train_task.run_train({})
    assert e.value.code == EX_TEMPFAIL == 75

    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(compose_config_with_hydra(["hydra.mode=MULTIRUN"]))
    try:
        assert train_task._in_multirun()
        assert train_task.run_train({}) == 3.5  # the sweep goes on
    finally:
        HydraConfig.instance().cfg = None
    cut["signal"] = None
    assert train_task.run_train({}) == 3.5


def compose_config_with_hydra(overrides: list[str]):
    """The composed config with its `hydra` node, as a Hydra job sees it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from convseq.cli.schema import register_configs
    from tests.conftest import CONF_DIR

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=True)
