"""Training's hot loop does not make the host wait for the device.

On a GPU, a Python number copied to the device (``torch.as_tensor(n, device=cuda)``) or a value
read back (``.item()``) waits for every queued kernel; on the CPU both cost nothing, so these
tests look at what the code asks for rather than at the time it takes.
"""

from __future__ import annotations

import re
import signal
from collections import Counter
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch

from convseq.data.dataset import LanguagePairDataset
from convseq.training import signals as signals_module
from convseq.training.signals import SignalCallback
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

    monkeypatch.setattr(signals_module.dist, "all_reduce", all_reduce)
    monkeypatch.setattr(signals_module.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(signals_module.dist, "new_group", lambda backend=None: f"{backend} group")
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


# one epoch, the progress bar drawn at every batch, figures logged every 4 updates
BAR_ON = [
    "trainer.max_epochs=1",
    "trainer.log_every_n_steps=4",
    "trainer.enable_progress_bar=true",
    "trainer.progress=bar",
]


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
        *BAR_ON,
        "max_update=10",
        "final_test=false",
    )
    train(cfg)
    rows = read_metrics(tmp_path / "csv" / METRICS_FILE)
    steps = sorted(int(r["step"]) for r in rows if "train/loss" in r)
    # updates 4 and 8, and update 10 where max_update stops the run (Lightning logs a stop)
    assert steps == [3, 7, 9]
    assert len(made) == len(steps)


def _without_lines(sites: dict[str, int]) -> Counter:
    """`DeviceReads.sites` without line numbers: "tolist at convseq/x.py (function)"."""
    return Counter({re.sub(r":\d+ \(", " (", k): v for k, v in sites.items()})


class _PerUpdate(pl.Callback):
    """Device reads, copies and collectives of each update window, from one batch start to
    the next (the last window runs to the end of training)."""

    def __init__(self) -> None:
        self.windows: list[Counter] = []

    def on_train_start(self, trainer, module) -> None:
        from tests.search.host_reads import DeviceReads

        self.mode = DeviceReads(sites=True).__enter__()
        self.seen = Counter()

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        now = _without_lines(self.mode.sites)
        self.windows.append(now - self.seen)
        self.seen = now

    def on_train_end(self, trainer, module) -> None:
        self.on_train_batch_start(trainer, module, None, None)
        self.mode.__exit__(None, None, None)
        self.windows.pop(0)  # what ran before the first batch


FINITE_CHECK = "tolist at convseq/training/module.py (configure_gradient_clipping)"
LOGGED_COPY = "cpu at convseq/training/metrics.py (on_host)"


def test_an_update_reads_the_device_once_with_the_progress_bar_on(tiny_data, tmp_path):
    """The default config's training step through Lightning, the bar drawn at every batch:
    the finite check is the one read of an update; a logging step adds the one copy of its
    figures to the host; nothing copies a Python number to the device."""
    from convseq.tasks.train import train
    from tests.training_utils import tiny_config

    counter = _PerUpdate()
    cfg = tiny_config(
        tiny_data,
        tmp_path,
        *BAR_ON,
        "max_update=13",
        "final_test=false",
    )
    train(cfg, callbacks=[counter])
    windows = counter.windows
    assert len(windows) == 13
    for update, seen in enumerate(windows[:-1], start=1):  # the last one holds the validation
        expected = Counter({FINITE_CHECK: 1})
        if update % 4 == 0:
            expected[LOGGED_COPY] = 1
        assert seen == expected, (update, seen)
    assert windows[-1][FINITE_CHECK] == 1


def test_the_device_read_counter_sees_what_a_gpu_would_wait_for():
    """`DeviceReads` counts reads of device values and copies of Python numbers to a device,
    and not reads of values already in host memory."""
    from tests.search.host_reads import DeviceReads

    on_device = torch.arange(3.0)
    with DeviceReads() as seen:
        total = on_device.sum()
        bool(total > 0), float(total), total.item(), on_device.tolist()
        torch.tensor(0.5, device="cpu")
        host = total.cpu()  # the copy is a read; what follows from it is not
        (host * 2).item(), float(host), torch.tensor([1.0]).item()
    assert seen.by_name == Counter({"_local_scalar_dense": 3, "tolist": 1, "cpu": 1})
    assert sum(seen.copies.values()) == 1
