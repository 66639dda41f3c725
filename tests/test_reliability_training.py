"""Training under attack: NaN and inf, kill -9 in the middle of a save, a full or read-only disk.

Each test checks the message (it names the step, the module or the file, and says what to do)
and that nothing was lost: last.ckpt and best.ckpt are as they were before the failure, and the
run continues from them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

import convseq.checkpoints.io as checkpoint_mod
from convseq.checkpoints.io import load_checkpoint
from convseq.errors import CheckpointWriteError, ConvseqError, NonFiniteError
from convseq.tasks.train import train
from tests.conftest import ROOT
from tests.training_utils import summary, tiny_config

UPDATES_PER_EPOCH = 18  # the tiny corpus at batching.max_tokens=300
TIMED = ("wps", "ups", "time")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _checkpoints(out: Path) -> dict[str, str]:
    folder = out / "checkpoints"
    return {p.name: _sha(p) for p in sorted(folder.iterdir())} if folder.is_dir() else {}


def _finite(state_dict: dict) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in state_dict.values() if t.is_floating_point())


def _deterministic(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if not k.endswith(TIMED)} for h in history]


# -- NaN and inf -----------------------------------------------------------------------------------
class Poison(pl.Callback):
    """Before update `at`: a NaN in parameter `name`, or an inf gradient for it (`grad=True`).

    Also records the checkpoint files as they were just before the poisoned update.
    """

    def __init__(self, at: int, name: str, grad: bool = False):
        self.at, self.name, self.grad = at, name, grad
        self.before: dict[str, str] | None = None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step + 1 != self.at or self.before is not None:
            return
        self.before = _checkpoints(Path(trainer.default_root_dir))
        param = dict(module.named_parameters())[self.name]
        if self.grad:
            param.register_hook(lambda g: torch.full_like(g, math.inf))
        else:
            with torch.no_grad():
                param.view(-1)[0] = math.nan


def test_a_nan_stops_at_once_naming_the_update_and_module_and_keeps_a_crash_checkpoint(
    tiny_data, one_thread, tmp_path
):
    poison = Poison(at=22, name="model.decoder.fc2.bias")
    with pytest.raises(NonFiniteError) as e:
        train(tiny_config(tiny_data, tmp_path, "trainer.max_epochs=3"), callbacks=[poison])
    msg = str(e.value)
    crash = tmp_path / "checkpoints" / "crash.ckpt"
    assert isinstance(e.value, ConvseqError)  # run.py prints it as one line, exit status 2
    assert msg.startswith("the loss is nan and the gradient norm is nan at update 22 (epoch 2)")
    assert "first non-finite output: model.decoder.fc2 " in msg
    assert "non-finite gradients in model." in msg
    assert "resume=true" in msg and msg.endswith(f"saved in {crash}.")

    # best.ckpt and last.ckpt are the epoch-1 files, byte for byte; crash.ckpt is the bad state.
    after = _checkpoints(tmp_path)
    assert poison.before == {"best.ckpt": after["best.ckpt"], "last.ckpt": after["last.ckpt"]}
    assert sorted(after) == ["best.ckpt", "crash.ckpt", "last.ckpt"]
    last = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert last["global_step"] == UPDATES_PER_EPOCH and _finite(last["state_dict"])
    bad = load_checkpoint(crash)
    assert bad["global_step"] == 21
    assert math.isnan(bad["state_dict"]["model.decoder.fc2.bias"][0])
    assert not (tmp_path / "summary.json").exists()

    train(tiny_config(tiny_data, tmp_path, "trainer.max_epochs=2", "resume=true"))
    s = summary(tmp_path)
    assert s["epochs"] == 2 and s["updates"] == 2 * UPDATES_PER_EPOCH
    assert all(math.isfinite(h["valid/loss"]) for h in s["history"])


def test_an_inf_gradient_with_a_finite_loss_names_the_parameter(tiny_data, one_thread, tmp_path):
    poison = Poison(at=22, name="model.encoder.fc1.bias", grad=True)
    with pytest.raises(NonFiniteError) as e:
        train(tiny_config(tiny_data, tmp_path, "trainer.max_epochs=3"), callbacks=[poison])
    msg = str(e.value)
    assert msg.startswith("the gradient norm is inf at update 22 (epoch 2)")
    assert "every module's output is finite" in msg
    assert "non-finite gradients in model.encoder.fc1.bias)" in msg
    assert (tmp_path / "checkpoints" / "crash.ckpt").is_file()
    after = _checkpoints(tmp_path)
    assert poison.before == {"best.ckpt": after["best.ckpt"], "last.ckpt": after["last.ckpt"]}


# -- kill -9 in the middle of writing a checkpoint -------------------------------------------------
# The child trains 2 epochs; its epoch-2 last.ckpt write goes through a file object that, after
# 4 KiB, flushes what it has to disk, prints PAUSED and sleeps: the parent then kills it.
CHILD = r"""
import json, os, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
import convseq.checkpoints.io as ck
from convseq.tasks.train import train
from tests.training_utils import tiny_config

tiny = {k: Path(v) for k, v in json.loads(sys.argv[1]).items()}
real_save, real_atomic = torch.save, ck.atomic_torch_save
pause = {"on": False}

class PausingFile:
    def __init__(self, f):
        self.f, self.written = f, 0
    def write(self, data):
        n = self.f.write(data)
        self.written += len(data)
        if self.written >= 4096:
            self.f.flush()
            os.fsync(self.f.fileno())
            print("PAUSED", self.written, flush=True)
            time.sleep(300)
        return n
    def flush(self):
        self.f.flush()

def atomic(obj, path):
    pause["on"] = Path(path).name == "last.ckpt" and obj["global_step"] > 18
    return real_atomic(obj, path)

def save(obj, f, *args, **kwargs):
    return real_save(obj, PausingFile(f) if pause["on"] else f, *args, **kwargs)

ck.atomic_torch_save = atomic
torch.save = save
train(tiny_config(tiny, sys.argv[2], "trainer.max_epochs=2"))
print("FINISHED", flush=True)
"""


def test_kill_9_inside_a_checkpoint_write_leaves_the_previous_last_ckpt_resumable(
    tiny_data, one_thread, tmp_path
):
    out = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "OMP_NUM_THREADS": "1",
    }
    with open(tmp_path / "child.err", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps({k: str(v) for k, v in tiny_data.items()})]
            + [str(out)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        watchdog = threading.Timer(240, proc.kill)
        watchdog.start()
        try:
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if line.startswith(("PAUSED", "FINISHED")):
                    break
            assert lines and lines[-1].startswith("PAUSED"), (
                "".join(lines) + (tmp_path / "child.err").read_text()[-3000:]
            )
            (tmp, *others) = list((out / "checkpoints").glob(".last.ckpt.*.tmp"))
            assert not others
            partial = tmp.stat().st_size
            assert partial >= 4096  # the save is under way: part of the new file is on disk
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=60) == -signal.SIGKILL
        finally:
            watchdog.cancel()
            proc.kill()
            proc.wait()

    last = load_checkpoint(out / "checkpoints" / "last.ckpt")  # complete, and still epoch 1's
    assert last["global_step"] == UPDATES_PER_EPOCH and last["epoch"] == 0
    assert tmp.stat().st_size == partial < (out / "checkpoints" / "last.ckpt").stat().st_size

    train(tiny_config(tiny_data, out, "trainer.max_epochs=2", "resume=true"))
    assert not tmp.exists(), "the killed process's temporary file is cleaned up on resume"
    ref = tmp_path / "straight"
    train(tiny_config(tiny_data, ref, "trainer.max_epochs=2"))
    a, b = summary(ref), summary(out)
    assert b["epochs"] == 2 and b["updates"] == 2 * UPDATES_PER_EPOCH
    assert _deterministic(a["history"]) == _deterministic(b["history"])
    sa = load_checkpoint(ref / "checkpoints" / "last.ckpt")["state_dict"]
    sb = load_checkpoint(out / "checkpoints" / "last.ckpt")["state_dict"]
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


# -- full disk, read-only folder --------------------------------------------------------------------
class _FullDiskFile:
    """A file whose writes fail with ENOSPC once `limit` bytes are written."""

    def __init__(self, f, limit: int = 4096):
        self.f, self.limit, self.written = f, limit, 0

    def write(self, data):
        if self.written + len(data) > self.limit:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.written += len(data)
        return self.f.write(data)

    def flush(self):
        self.f.flush()


def test_a_full_disk_while_saving_is_a_clear_error_and_the_previous_checkpoints_survive(
    tiny_data, one_thread, tmp_path, monkeypatch
):
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        full = isinstance(obj, dict) and obj.get("global_step", 0) > UPDATES_PER_EPOCH
        return real_save(obj, _FullDiskFile(f) if full else f, *args, **kwargs)

    monkeypatch.setattr(checkpoint_mod.torch, "save", save)
    with pytest.raises(CheckpointWriteError) as e:
        train(tiny_config(tiny_data, tmp_path, "trainer.max_epochs=3"))
    monkeypatch.undo()
    best = tmp_path / "checkpoints" / "best.ckpt"  # epoch 2 improves: best.ckpt is saved first
    assert isinstance(e.value, OSError) and e.value.errno == errno.ENOSPC
    msg = str(e.value)
    assert msg.startswith(f"{best}: cannot write the checkpoint (No space left on device)")
    assert "the previous best.ckpt is unchanged" in msg and "resume=true" in msg
    assert sorted(p.name for p in best.parent.iterdir()) == ["best.ckpt", "last.ckpt"]
    for name in ("best.ckpt", "last.ckpt"):
        assert load_checkpoint(best.parent / name)["global_step"] == UPDATES_PER_EPOCH

    train(tiny_config(tiny_data, tmp_path, "trainer.max_epochs=2", "resume=true"))
    assert summary(tmp_path)["updates"] == 2 * UPDATES_PER_EPOCH


def _chmod_protects(tmp_path: Path) -> bool:
    """Whether a mode-555 folder refuses this process's writes (not for root with its caps)."""
    probe = tmp_path / "probe"
    probe.mkdir()
    probe.chmod(0o555)
    try:
        (probe / "x").write_bytes(b"")
    except PermissionError:
        return True
    finally:
        probe.chmod(0o755)
        shutil.rmtree(probe)
    return False


class ReadOnlyFrom(pl.Callback):
    """From epoch `epoch` (1-based) on, the checkpoints folder can no longer be written."""

    def __init__(self, epoch: int, how: str, monkeypatch):
        self.epoch, self.how, self.monkeypatch = epoch, how, monkeypatch

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch + 1 != self.epoch:
            return
        folder = Path(trainer.default_root_dir) / "checkpoints"
        if self.how == "chmod":
            folder.chmod(0o555)
            return
        real_open = os.open

        def read_only_open(path, flags, *args, **kwargs):
            if Path(path).parent == folder and flags & (os.O_WRONLY | os.O_RDWR):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real_open(path, flags, *args, **kwargs)

        self.monkeypatch.setattr(os, "open", read_only_open)


@pytest.mark.parametrize("how", ["EROFS", "chmod"])
def test_a_folder_that_turns_read_only_is_a_clear_error_and_last_ckpt_survives(
    tiny_data, one_thread, tmp_path, monkeypatch, how
):
    if how == "chmod" and not _chmod_protects(tmp_path):
        pytest.skip("this user writes into a read-only folder anyway (the EROFS case covers it)")
    folder = tmp_path / "checkpoints"
    try:
        with pytest.raises(CheckpointWriteError) as e:
            train(
                tiny_config(tiny_data, tmp_path, "trainer.max_epochs=3"),
                callbacks=[ReadOnlyFrom(2, how, monkeypatch)],
            )
    finally:
        monkeypatch.undo()
        folder.chmod(0o755)
    code = errno.EROFS if how == "EROFS" else errno.EACCES
    assert e.value.errno == code and os.strerror(code) in str(e.value)
    assert str(e.value).startswith(str(folder / "best.ckpt"))
    assert "is unchanged" in str(e.value)
    assert load_checkpoint(folder / "last.ckpt")["global_step"] == UPDATES_PER_EPOCH
    assert sorted(p.name for p in folder.iterdir()) == ["best.ckpt", "last.ckpt"]


@pytest.mark.parametrize("how", ["a file in the way", "EROFS", "chmod"])
def test_an_unwritable_output_folder_fails_before_training(
    tiny_data, one_thread, tmp_path, monkeypatch, how
):
    out = tmp_path / "run"
    folder = out / "checkpoints"
    code = {"a file in the way": errno.ENOTDIR, "EROFS": errno.EROFS, "chmod": errno.EACCES}[how]
    if how == "a file in the way":
        out = tmp_path / "notes.txt" / "run"
        folder = out / "checkpoints"
        out.parent.write_text("a file where a folder should be\n")
    elif how == "chmod":
        if not _chmod_protects(tmp_path):
            pytest.skip(
                "this user writes into a read-only folder anyway (the EROFS case covers it)"
            )
        out.mkdir()
        out.chmod(0o555)
    else:
        real_open = os.open

        def read_only_open(path, flags, *args, **kwargs):
            if str(path).startswith(str(out)) and flags & (os.O_WRONLY | os.O_RDWR):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", read_only_open)
    try:
        with pytest.raises(CheckpointWriteError) as e:
            train(tiny_config(tiny_data, out, "trainer.max_epochs=1"))
    finally:
        monkeypatch.undo()
        if how == "chmod":
            out.chmod(0o755)
    assert e.value.errno == code
    assert str(e.value).startswith(f"{folder}: cannot write checkpoints there")
    assert "hydra.run.dir" in str(e.value)
    assert not (out / "csv").exists() if out.is_dir() else True  # no epoch was started


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_real_enospc_from_the_kernel_is_reported_and_the_old_file_kept(tmp_path, monkeypatch):
    # The temporary file is opened on /dev/full, whose every write fails with ENOSPC in the
    # kernel; torch's zip writer turns that into a RuntimeError, which must still read as such.
    path = tmp_path / "last.ckpt"
    torch.save({"global_step": 1}, path)
    before = _sha(path)
    real_open = os.open

    def open_full(p, flags, *args, **kwargs):
        if str(p).endswith(".tmp"):
            return real_open("/dev/full", os.O_WRONLY)
        return real_open(p, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_full)
    with pytest.raises(CheckpointWriteError) as e:
        checkpoint_mod.atomic_torch_save({"w": torch.zeros(100_000)}, path)
    monkeypatch.undo()
    assert e.value.errno == errno.ENOSPC
    assert str(e.value).startswith(f"{path}: cannot write the checkpoint (No space left on device)")
    assert _sha(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
