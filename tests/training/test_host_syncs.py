"""Training's hot loop does not make the host wait for the device.

On a GPU, a Python number copied to the device (``torch.as_tensor(n, device=cuda)``) or a value
read back (``.item()``) waits for every queued kernel; on the CPU both cost nothing, so these
tests look at what the code asks for rather than at the time it takes.
"""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest
import torch

from convseq.data.dataset import LanguagePairDataset
from convseq.training import callbacks as callbacks_module
from convseq.training.callbacks import SignalCallback
from tests.training_utils import tiny_databin


def test_a_micro_batch_copies_no_python_number_to_the_device(tiny_data, monkeypatch):
    from convseq.training.module import ConvSeqModule

    databin = tiny_databin(tiny_data)
    module = ConvSeqModule(
        model={
            "arch": "fconv_toy",
            "encoder_embed_dim": 16,
            "decoder_embed_dim": 16,
            "decoder_out_embed_dim": 16,
            "encoder_layers": [[16, 3]],
            "decoder_layers": [[16, 3]],
        },
        src_vocab=databin.src_dict.to_list(),
        tgt_vocab=databin.tgt_dict.to_list(),
        criterion={"label_smoothing": 0.1, "normalize": "sentences"},
    )
    ds = LanguagePairDataset(*databin.split("train"), pad=databin.tgt_dict.pad())
    batch = ds.collater([ds[i] for i in range(8)])
    made = []
    for name in ("as_tensor", "tensor"):
        original = getattr(torch, name)

        def spy(data, *args, _original=original, **kwargs):
            if isinstance(data, (int, float)) and kwargs.get("device") is not None:
                made.append(data)
            return _original(data, *args, **kwargs)

        monkeypatch.setattr(torch, name, spy)
    loss, sums = module._batch_sums(batch)
    assert made == []  # the sentence counts (here also the sample size) went to a fill kernel
    assert sums.dtype == torch.float64 and sums.shape == (5,)
    assert float(sums[0]) == float(sums[2]) == 8.0  # normalize=sentences: sample size = 8


def test_the_signal_flag_is_agreed_on_the_cpu_not_on_the_training_device(monkeypatch):
    """Under DDP on GPUs the flag must not be an all-reduced device tensor read by the host."""
    reduced = []

    def all_reduce(tensor, op=None, group=None):
        reduced.append((tensor.device.type, group))
        tensor += 1.0  # the other rank received a signal

    monkeypatch.setattr(callbacks_module.dist, "all_reduce", all_reduce)
    monkeypatch.setattr(callbacks_module.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(callbacks_module.dist, "new_group", lambda backend=None: f"{backend} group")
    # a device the host cannot read from at all: reading the flag from it would fail
    strategy = SimpleNamespace(root_device=torch.device("meta"))
    strategy.reduce = lambda t, reduce_op=None: pytest.fail("the flag went through the device")
    trainer = SimpleNamespace(world_size=2, strategy=strategy)
    cb = SignalCallback("unused.ckpt")
    assert cb._agreed(trainer) is True  # this rank saw nothing; the other one did
    assert cb.received == int(signal.SIGTERM)
    assert reduced == [("cpu", "gloo group")]
    cb._agreed(trainer)
    assert reduced[-1] == ("cpu", "gloo group")  # the group is made once and kept


def test_update_figures_are_made_and_logged_on_logging_steps_only(tiny_data, tmp_path, monkeypatch):
    """Logged at every update, the bar's figures were read back (`.item()`) and the Python
    numbers copied to the device at every batch; now only on the updates Lightning writes."""
    from convseq.evaluation.history import METRICS_FILE, read_metrics
    from convseq.tasks.train import train
    from convseq.training import module as module_module
    from tests.training_utils import tiny_config

    made = []
    original = module_module.update_metrics

    def spy(sums, seconds, lr, gnorm, clipped):
        made.append(gnorm)
        return original(sums, seconds, lr, gnorm, clipped)

    monkeypatch.setattr(module_module, "update_metrics", spy)
    cfg = tiny_config(
        tiny_data,
        tmp_path,
        "trainer.max_epochs=1",
        "trainer.log_every_n_steps=4",
        "trainer.enable_progress_bar=true",
        "trainer.progress=bar",
        "max_update=10",
        "final_test=false",
    )
    train(cfg)
    rows = read_metrics(tmp_path / "csv" / METRICS_FILE)
    steps = sorted(int(r["step"]) for r in rows if "train/loss" in r)
    # updates 4 and 8, and update 10 where max_update stops the run (Lightning logs a stop)
    assert steps == [3, 7, 9]
    assert len(made) == len(steps)
