"""train(cfg): end to end, every optimiser x annealing pair, the stopping rules, checkpoints."""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
import pytorch_lightning as pl
import torch

import convseq.checkpoints.io as checkpoint_mod
from convseq.cli.dispatch import dispatch
from convseq.errors import CheckpointError
from convseq.evaluation.history import read_metrics
from convseq.optim.nag import NAG
from convseq.tasks.train import train
from convseq.training.callbacks import AnnealingCallback
from tests.conftest import ROOT, compose_config
from tests.training_utils import QUIET, TINY_MODEL, last_checkpoint, summary, tiny_config


def test_train_runs_logs_checkpoints_and_returns_the_best_valid_loss(
    tiny_data, one_thread, tmp_path
):
    out = tmp_path / "run"
    cfg = compose_config(
        [
            "data.generator=null",
            f"data.dir={tiny_data['corpus']}",
            f"paths.cache_dir={tiny_data['cache']}",
            "batching.max_tokens=300",
            *TINY_MODEL,
            *QUIET,
            "trainer.max_epochs=3",
        ],
        output_dir=str(out),
    )
    best = dispatch(cfg)  # what run.py returns to a sweeper

    s = summary(out)
    assert s["epochs"] == 3 and s["updates"] == 3 * 18
    assert s["stop_reason"] == "reached trainer.max_epochs=3"
    valid = [h["valid/loss"] for h in s["history"]]
    assert best == s["best_value"] == min(valid)
    assert valid[-1] < valid[0]  # it learns
    assert [h["epoch"] for h in s["history"]] == [1, 2, 3]
    assert all(h["train_epoch/lr"] == 0.25 for h in s["history"])
    assert math.isfinite(s["test"]["test/loss"]) and s["test"]["test/ppl"] > 1
    assert s["best_checkpoint"] == str(out / "checkpoints" / "best.ckpt")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]

    rows = read_metrics(out / "csv" / "metrics.csv")
    epochs = [r for r in rows if "train_epoch/loss" in r]
    assert [r["epoch"] for r in epochs] == [0, 1, 2]
    assert [r["train_epoch/loss"] for r in epochs] == pytest.approx(
        [h["train_epoch/loss"] for h in s["history"]], rel=1e-6
    )
    assert [r["valid/loss"] for r in rows if "valid/loss" in r] == pytest.approx(valid, rel=1e-6)
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 3 * 18 // 5  # every log_every_n_steps=5 updates
    for r in steps:
        assert r["train/wps"] > 0 and r["train/ups"] > 0 and r["train/lr"] == 0.25
        assert r["train/wpb"] > 0 and r["train/bsz"] > 0 and r["train/gnorm"] > 0
        assert r["train/clip"] in (0.0, 1.0)
        assert r["train/ppl"] == pytest.approx(2 ** r["train/nll_loss"], rel=1e-4)
    # The logged gradient norm is the one before clipping (clip_norm 0.1): clip = gnorm > 0.1.
    assert all(r["train/clip"] == float(r["train/gnorm"] > 0.1) for r in steps)
    assert all(r["train_epoch/time"] > 0 and r["train_epoch/wps"] > 0 for r in epochs)
    assert list(out.glob("checkpoints/.*tmp")) == []


class Probe(pl.Callback):
    """What a fast_dev_run actually used: optimiser, its settings, annealer, loss, weights."""

    def on_fit_start(self, trainer, module):
        self.before = {n: p.detach().clone() for n, p in module.named_parameters()}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        opt = trainer.optimizers[0]
        self.optimizer = opt
        self.group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
        self.loss = float(outputs["loss"])
        self.after = {n: p.detach().clone() for n, p in module.named_parameters()}
        self.annealer = next(
            c for c in trainer.callbacks if isinstance(c, AnnealingCallback)
        ).annealer
        self.clip = trainer.gradient_clip_val


OPTIMS = {
    "nag": (["optim.lr=0.3", "optim.momentum=0.9", "optim.weight_decay=0.01"], NAG),
    "sgd": (["optim.lr=0.3", "optim.momentum=0.9", "optim.weight_decay=0.01"], torch.optim.SGD),
    "adam": (["optim.lr=0.002", "optim.betas=[0.8,0.95]", "optim.eps=1e-7"], torch.optim.AdamW),
}
ANNEALS = {
    "plateau": ["anneal.lr_shrink=0.5", "anneal.lr_threshold=0.01"],
    "force": ["anneal.lr_shrink=0.5", "anneal.force_anneal=7"],
    "lua": ["anneal.lr_shrink=0.5", "anneal.min_epoch_to_anneal=3"],
    "none": [],
}


@pytest.mark.parametrize("anneal", list(ANNEALS))
@pytest.mark.parametrize("optim", list(OPTIMS))
def test_fast_dev_run_of_every_optimiser_and_annealing(
    tiny_data, one_thread, tmp_path, optim, anneal
):
    overrides, cls = OPTIMS[optim]
    cfg = tiny_config(
        tiny_data,
        tmp_path,
        f"optim={optim}",
        f"anneal={anneal}",
        *overrides,
        *ANNEALS[anneal],
        "trainer.fast_dev_run=true",
    )
    probe = Probe()
    train(cfg, callbacks=[probe])

    assert math.isfinite(probe.loss) and probe.loss > 0
    assert max((probe.after[n] - probe.before[n]).abs().max().item() for n in probe.before) > 0
    assert type(probe.optimizer) is cls
    g = probe.group
    if optim == "adam":
        assert (g["lr"], g["betas"], g["eps"], g["weight_decay"]) == (0.002, (0.8, 0.95), 1e-7, 0.0)
        assert probe.clip is None  # conf/optim/adam.yaml: clip_norm 0
    else:
        assert (g["lr"], g["momentum"], g["weight_decay"]) == (0.3, 0.9, 0.01)
        assert probe.clip == 0.1  # optim.clip_norm reaches the Trainer
    a = probe.annealer
    assert a.name == anneal and a.base_lr == g["lr"]
    if anneal != "none":
        assert a.lr_shrink == 0.5
    assert {
        "plateau": a.lr_threshold == 0.01,
        "force": a.force_anneal == 7,
        "lua": a.min_epoch_to_anneal == 3,
        "none": a.min_lr == 0.0,
    }[anneal]


def _tiny(tiny, out, *overrides):
    return tiny_config(tiny, out, *overrides)


def test_training_stops_when_the_next_lr_falls_below_min_lr(tiny_data, one_thread, tmp_path):
    # A threshold of 0.9 makes every validation after the first "not better": lr 0.25, 0.25,
    # then x0.1 each epoch; 0.0025 < min_lr 0.01 is the lr epoch 4 would use.
    cfg = _tiny(
        tiny_data,
        tmp_path,
        "anneal.lr_threshold=0.9",
        "anneal.min_lr=0.01",
        "trainer.max_epochs=10",
    )
    train(cfg)
    s = summary(tmp_path)
    assert [h["train_epoch/lr"] for h in s["history"]] == pytest.approx([0.25, 0.25, 0.025])
    assert s["epochs"] == 3 and "below anneal.min_lr" in s["stop_reason"]


def test_max_update_stops_in_the_middle_of_an_epoch(tiny_data, one_thread, tmp_path):
    train(_tiny(tiny_data, tmp_path, "max_update=25", "trainer.max_epochs=10"))
    s = summary(tmp_path)
    assert s["updates"] == 25 and s["stop_reason"] == "reached max_update=25 updates"
    assert s["history"][-1]["updates"] == 25 and "valid/loss" in s["history"][-1]  # validated


def test_patience_stops_after_that_many_validations_without_improvement(
    tiny_data, one_thread, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="convseq.progress")
    # lr 0: the weights never change, so every validation equals the first.
    train(
        _tiny(
            tiny_data,
            tmp_path,
            "optim.lr=0.0",
            "anneal=none",
            "patience=2",
            "trainer.max_epochs=10",
            "trainer.progress=lines",
        )
    )
    s = summary(tmp_path)
    assert s["epochs"] == 3 and "patience" in s["stop_reason"]
    assert len({h["valid/loss"] for h in s["history"]}) == 1
    # each validation line counts itself: 2 left after the first (a best), then 1, then 0
    lines = [r.getMessage() for r in caplog.records if r.name == "convseq.progress"]
    left = [
        int(m.group(1)) for x in lines if (m := re.search(r"\| valid .*patience (\d+) left", x))
    ]
    assert left == [2, 1, 0]


def test_a_run_stopped_by_patience_continues_with_the_patience_given_on_resume(
    tiny_data, one_thread, tmp_path
):
    still = ["optim.lr=0.0", "anneal=none", "trainer.max_epochs=10"]  # no validation improves
    train(_tiny(tiny_data, tmp_path, *still, "patience=2"))
    assert summary(tmp_path)["epochs"] == 3  # the first validation, then 2 without a better one
    # the states keep Lightning's keys, so checkpoints of either version resume in the other
    keys = list(last_checkpoint(tmp_path)["callbacks"])
    assert any(k.startswith("EarlyStopping{") for k in keys), keys
    assert any(k.startswith("ModelCheckpoint{'monitor': 'valid/loss'") for k in keys), keys
    train(_tiny(tiny_data, tmp_path, *still, "patience=4", "resume=true"))
    s = summary(tmp_path)  # 2 more without a better one: 4 in a row (Lightning's restored 2: 4)
    assert s["epochs"] == 5 and "no improvement of valid/loss in 4 validations" in s["stop_reason"]


@pytest.mark.parametrize("by_updates", [False, True])
def test_last_ckpt_follows_every_epoch_after_the_best_stopped_improving(
    tiny_data, one_thread, tmp_path, by_updates
):
    # lr 0: only the first validation is a best; last.ckpt must still be the last epoch's
    extra = ["validate_interval_updates=5"] if by_updates else []
    train(_tiny(tiny_data, tmp_path, "optim.lr=0.0", "anneal=none", "trainer.max_epochs=3", *extra))
    last = last_checkpoint(tmp_path)
    assert (last["epoch"], last["global_step"]) == (2, 54)  # 3 epochs of 18 updates
    best = torch.load(tmp_path / "checkpoints" / "best.ckpt", weights_only=True)
    assert best["global_step"] == (5 if by_updates else 18)
    # summary.json: every validation, not only those up to the best (tested with best.ckpt)
    s = summary(tmp_path)
    last_valid = 50 if by_updates else 54  # every 5 updates, or at each epoch's end
    assert s["last_validation"]["updates"] == last_valid and s["validations"][-1]["epoch"] == 3


def test_a_copied_run_folder_resumes_with_its_best_score(tiny_data, one_thread, tmp_path):
    # lr 0: epoch 1's valid loss is the best, and every later epoch only equals it
    still = ["optim.lr=0.0", "anneal=none"]
    train(_tiny(tiny_data, tmp_path / "a", *still, "trainer.max_epochs=2"))
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # moved or copied: another dirpath
    train(_tiny(tiny_data, tmp_path / "b", *still, "trainer.max_epochs=4", "resume=true"))
    best = torch.load(tmp_path / "b" / "checkpoints" / "best.ckpt", weights_only=True)
    assert best["global_step"] == 18  # still epoch 1's, not the first epoch after the resume
    states = last_checkpoint(tmp_path / "b")["callbacks"]
    (state,) = [v for k, v in states.items() if k.startswith("ModelCheckpoint{'monitor'")]
    assert state["dirpath"] == str(tmp_path / "b" / "checkpoints")
    assert state["best_model_path"] == str(tmp_path / "b" / "checkpoints" / "best.ckpt")
    first = summary(tmp_path / "a")["validations"][0]["valid/loss"]
    assert float(state["best_model_score"]) == pytest.approx(first, rel=1e-6)


def test_per_epoch_checkpoints_keep_the_last_n(tiny_data, one_thread, tmp_path):
    train(_tiny(tiny_data, tmp_path, "checkpoint.keep_epochs=2", "trainer.max_epochs=3"))
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["best.ckpt", "epoch002.ckpt", "epoch003.ckpt", "last.ckpt"]
    ep3 = torch.load(tmp_path / "checkpoints" / "epoch003.ckpt", weights_only=True)
    assert torch.equal(
        ep3["state_dict"]["model.decoder.fc3.weight_v"],
        last_checkpoint(tmp_path)["state_dict"]["model.decoder.fc3.weight_v"],
    )


def test_resume_refuses_what_it_cannot_continue(tiny_data, one_thread, tmp_path):
    with pytest.raises(CheckpointError, match="resume=true found no checkpoint"):
        train(_tiny(tiny_data, tmp_path / "empty", "resume=true"))
    with pytest.raises(CheckpointError, match="resume=PATH"):
        train(_tiny(tiny_data, tmp_path / "x", f"resume={tmp_path / 'nowhere'}"))
    run = tmp_path / "run"
    train(_tiny(tiny_data, run, "trainer.max_epochs=1"))
    with pytest.raises(CheckpointError, match="already holds a run"):
        train(_tiny(tiny_data, run, "trainer.max_epochs=1"))
    with pytest.raises(CheckpointError, match="another model configuration.*encoder_embed_dim"):
        train(_tiny(tiny_data, tmp_path / "other", f"resume={run}", "model.encoder_embed_dim=8"))


def test_a_failed_checkpoint_write_leaves_the_previous_last_ckpt_intact(
    tiny_data, one_thread, tmp_path, monkeypatch
):
    real_save, calls = torch.save, []

    def failing_save(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # epoch 1 wrote best + last; epoch 2's first write dies half-way
            f.write(b"partial bytes")
            raise OSError(28, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint_mod.torch, "save", failing_save)
    with pytest.raises(OSError, match="No space left"):
        train(_tiny(tiny_data, tmp_path, "trainer.max_epochs=3"))
    monkeypatch.undo()
    ckpt = last_checkpoint(tmp_path)  # still the complete epoch-1 checkpoint
    assert ckpt["epoch"] == 0 and ckpt["global_step"] == 18
    assert list((tmp_path / "checkpoints").glob(".*")) == [], "no temporary file left behind"


def test_run_py_trains_in_its_hydra_folder(tiny_data, tmp_path):
    outputs = tmp_path / "outputs"
    env = {**os.environ, "CONVSEQ_OUTPUTS": str(outputs), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "data.generator=null",
            f"data.dir={tiny_data['corpus']}",
            f"paths.cache_dir={tiny_data['cache']}",
            "batching.max_tokens=300",
            *TINY_MODEL,
            *QUIET,
            "trainer.max_epochs=1",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [p.parent for p in outputs.rglob("summary.json")]
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and (run_dir / ".hydra").is_dir()
    assert "convseq: 1 epoch, 18 updates" in proc.stdout
    assert summary(run_dir)["stop_reason"] == "reached trainer.max_epochs=1"


def test_resume_from_another_runs_folder_continues_its_history(tiny_data, one_thread, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    train(_tiny(tiny_data, first, "trainer.max_epochs=1"))
    train(_tiny(tiny_data, second, f"resume={first}", "trainer.max_epochs=2"))
    s = summary(second)
    assert s["resumed_from"] == str(first / "checkpoints" / "last.ckpt")
    assert [h["epoch"] for h in s["history"]] == [1, 2] and s["updates"] == 36
    assert s["history"][0] == summary(first)["history"][0]
    assert (second / "checkpoints" / "last.ckpt").is_file()
    assert last_checkpoint(first)["global_step"] == 18  # the source run is left as it was


def test_a_non_finite_gradient_stops_training_with_a_clear_error(tiny_data, one_thread, tmp_path):
    # An absurd lr blows the weights up on the first update; the second gradient is not finite.
    cfg = _tiny(tiny_data, tmp_path, "optim=sgd", "optim.lr=1e30", "optim.clip_norm=0")
    with pytest.raises(FloatingPointError, match=r"gradient norm is (nan|inf) at update 2"):
        train(cfg)
