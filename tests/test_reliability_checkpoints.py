"""Checkpoints a stranger hands over: damaged, foreign, booby-trapped or of another model.

Every loader convseq has (`load_checkpoint`, `ConvSeqModule.load_from_checkpoint`, the Trainer's
checkpoint IO, `resume=`, and `convseq.inference.loading.load_any` behind generation's `ckpt=`) must refuse them with a CheckpointError naming the file, run nothing
from the file, and leave the run it was asked to continue as it was.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
from pathlib import Path

import pytest
import torch

from convseq.checkpoints.io import AtomicCheckpointIO, load_checkpoint
from convseq.errors import CheckpointError
from convseq.inference.loading import load_any
from convseq.tasks.train import train
from convseq.training.module import ConvSeqModule
from tests.training_utils import summary, tiny_config, train_one_tiny_epoch


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory) -> Path:
    """One epoch of the tiny model: a run folder with best.ckpt and last.ckpt."""
    return train_one_tiny_epoch(tiny_data, tmp_path_factory.mktemp("trained"))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _folder_state(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): _sha(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def _bad_file(kind: str, good: Path, path: Path) -> Path:
    if kind == "truncated":
        data = good.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif kind == "text":
        path.write_text("ein Haus\na house\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "random bytes":
        path.write_bytes(bytes(range(256)) * 8)
    elif kind == "a list":
        torch.save([1, 2, 3], path)
    elif kind == "a dict of something else":
        torch.save({"weights": torch.zeros(3)}, path)
    return path


KINDS = ["truncated", "text", "empty", "random bytes", "a list", "a dict of something else"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_file_that_is_not_a_checkpoint_is_refused_by_every_loader(
    trained, tiny_data, one_thread, tmp_path, kind
):
    path = _bad_file(kind, trained / "checkpoints" / "last.ckpt", tmp_path / "model.ckpt")
    with pytest.raises(CheckpointError, match=str(path)):
        ConvSeqModule.load_from_checkpoint(str(path))
    with pytest.raises(CheckpointError, match=str(path)):
        load_any(path)  # task=generate / interactive ckpt=PATH
    if kind != "a dict of something else":  # a dict is a dict to the raw loader
        with pytest.raises(CheckpointError, match=str(path)):
            load_checkpoint(path)
        with pytest.raises(CheckpointError, match=str(path)):
            AtomicCheckpointIO().load_checkpoint(path)
    out = tmp_path / "continued"
    with pytest.raises(CheckpointError, match=str(path)):
        train(tiny_config(tiny_data, out, f"resume={path}", "trainer.max_epochs=2"))
    assert not list(out.rglob("*.ckpt")) and not (out / "summary.json").exists()


class _RunsShell:
    """Unpickling calls os.system (would create the marker file)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _WritesOnSetstate:
    """Unpickling calls __setstate__ (would create the marker file)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __setstate__(self, state):
        open(state["marker"], "w").close()


@pytest.mark.parametrize(
    ("payload", "global_name"),
    [(_RunsShell, "system"), (_WritesOnSetstate, "_WritesOnSetstate")],
)
def test_a_convseq_checkpoint_whose_pickle_would_run_code_is_refused_and_runs_nothing(
    trained, tiny_data, one_thread, tmp_path, monkeypatch, payload, global_name
):
    marker = tmp_path / "marker"
    ckpt = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    ckpt["callbacks"]["extra"] = payload(marker)  # hidden inside a real convseq checkpoint
    path = tmp_path / "last.ckpt"
    torch.save(ckpt, path)
    # torch would load unsafely where weights_only is left unset: convseq never leaves it unset.
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    out = tmp_path / "continued"
    loaders = {
        "load_checkpoint": lambda: load_checkpoint(path),
        "load_from_checkpoint": lambda: ConvSeqModule.load_from_checkpoint(str(path)),
        # what Lightning's fit/test(ckpt_path=...) calls, with the weights_only it passes (None)
        "checkpoint IO": lambda: AtomicCheckpointIO().load_checkpoint(path, weights_only=None),
        "resume": lambda: train(tiny_config(tiny_data, out, f"resume={path}")),
        "generation (ckpt=)": lambda: load_any(path),
    }
    for name, load in loaders.items():
        with pytest.raises(CheckpointError) as e:
            load()
        msg = str(e.value)
        assert msg.startswith(f"{path}: refused"), name
        assert global_name in msg and "could run code" in msg, name
        assert "weights_only=False" not in msg, name  # never suggests unsafe loading
        assert not marker.exists(), f"{name} ran code from the file"
    assert not list(out.rglob("*.ckpt"))
    # Asking for unsafe loading explicitly is refused too.
    with pytest.raises(ValueError, match="weights-only"):
        load_checkpoint(path, weights_only=False)
    with pytest.raises(ValueError, match="weights-only"):
        ConvSeqModule.load_from_checkpoint(str(path), weights_only=False)
    assert not marker.exists()


def test_a_fairseq_checkpoint_given_to_resume_is_refused_with_the_way_to_convert_it(
    tiny_data, one_thread, tmp_path
):
    path = tmp_path / "checkpoint_best.pt"
    torch.save({"args": argparse.Namespace(arch="fconv_iwslt_de_en"), "model": {}}, path)
    with pytest.raises(CheckpointError) as e:
        train(tiny_config(tiny_data, tmp_path / "run", f"resume={path}"))
    assert "argparse.Namespace" in str(e.value) and "task=import_fairseq" in str(e.value)


def test_resuming_with_another_architecture_is_refused_naming_what_differs(
    trained, tiny_data, one_thread, tmp_path
):
    before = _folder_state(trained)
    out = tmp_path / "other"
    with pytest.raises(CheckpointError) as e:
        train(tiny_config(tiny_data, out, f"resume={trained}", "model=fconv_iwslt_de_en"))
    msg = str(e.value)
    assert msg.startswith(str(trained / "checkpoints" / "last.ckpt"))
    assert "another model configuration" in msg
    assert "arch: 'fconv_toy' there, 'fconv_iwslt_de_en' now" in msg
    assert _folder_state(trained) == before and not list(out.rglob("*.ckpt"))


def test_weights_of_another_architecture_under_these_hyperparameters_are_refused(trained, tmp_path):
    # A file whose hyperparameters describe one model and whose weights belong to another.
    ckpt = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    ckpt["hyper_parameters"]["model"]["decoder_out_embed_dim"] = 24
    path = tmp_path / "mixed.ckpt"
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError) as e:
        ConvSeqModule.load_from_checkpoint(str(path))
    assert str(e.value).startswith(f"{path}: cannot load a ConvSeqModule")
    assert "size mismatch for model.decoder" in str(e.value)


def test_a_truncated_last_ckpt_is_refused_and_the_run_continues_from_best(
    trained, tiny_data, one_thread, tmp_path
):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    source = _folder_state(trained)
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])
    before = _folder_state(run)
    with pytest.raises(CheckpointError) as e:
        train(tiny_config(tiny_data, run, "resume=true", "trainer.max_epochs=2"))
    assert str(e.value).startswith(f"{last}: not a readable checkpoint")
    assert "best.ckpt" in str(e.value)  # says what to do instead
    assert _folder_state(run) == before  # metrics, summary, best.ckpt: all as they were

    best = run / "checkpoints" / "best.ckpt"
    train(tiny_config(tiny_data, run, f"resume={best}", "trainer.max_epochs=2"))
    s = summary(run)
    assert s["resumed_from"] == str(best) and s["epochs"] == 2 and s["updates"] == 36
    assert s["history"][0] == summary(trained)["history"][0]
    assert load_checkpoint(last)["global_step"] == 36
    assert _folder_state(trained) == source  # the run the copy came from is left alone
