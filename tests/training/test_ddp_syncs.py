"""convseq's DDP strategy drops three collectives of every update that Lightning's makes.

What is counted: `tests/search/host_reads.DeviceReads`, the dispatch mode that counts reads of
device data by the host (``_local_scalar_dense`` from ``.item()`` / ``bool(t)``, ``.tolist()``,
...), telling host memory apart even on a CPU, and the ``c10d`` collectives it sees. On CPU and
gloo neither costs a device wait, so what is measured is what the code asks for: each read of a
training-device tensor is one host-device synchronisation on a GPU, and each collective a wait
for the other ranks (a barrier on NCCL also blocks the host until the device is idle).

Lightning's `DDPStrategy`, per update: a SIGTERM flag broadcast from rank 0 and read back with
``.item()`` before every batch, DDP's broadcast of the buffers before every forward pass, and a
barrier before the all-reduce of the update's sums. `convseq.training.strategy.ConvSeqDDPStrategy`
makes none of them (the flag once per fit, at the first batch; fconv's buffers are constants);
convseq's `SignalCallback` agrees on signals over gloo itself, which the SIGTERM tests of
tests/training/test_ddp_resume.py check with this strategy.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from pytorch_lightning.strategies import DDPStrategy
from pytorch_lightning.utilities.exceptions import SIGTERMException

from convseq.training.strategy import (
    ConvSeqDDPStrategy,
    _EpochLoopSharingTheSignalOnce,
    strategy_argument,
)
from tests.search.host_reads import HostReads
from tests.training_utils import ddp_script_command, launch_env

UPDATES = 6


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of one rank, in this process."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddp_names_build_convseqs_strategy_and_others_pass_through():
    plain = strategy_argument("ddp")
    assert type(plain) is ConvSeqDDPStrategy and isinstance(plain, DDPStrategy)
    unused = strategy_argument("ddp_find_unused_parameters_true")
    assert type(unused) is ConvSeqDDPStrategy and unused._ddp_kwargs["find_unused_parameters"]
    for other in ("auto", "ddp_spawn", "fsdp", None):
        assert strategy_argument(other) == other


def test_a_sum_is_reduced_without_lightnings_barrier(one_rank_group):
    counts = {}
    for name, strategy in (("lightning", DDPStrategy()), ("convseq", ConvSeqDDPStrategy())):
        t = torch.tensor([1.0, 2.0])
        with HostReads() as seen:
            out = strategy.reduce(t, reduce_op="sum")
        assert out.tolist() == [1.0, 2.0]  # one rank: the sum is the tensor
        counts[name] = dict(seen.collectives)
    assert counts == {"lightning": {"barrier": 1, "allreduce_": 1}, "convseq": {"allreduce_": 1}}


def test_the_signal_flag_is_broadcast_once_per_fit_not_per_batch(one_rank_group):
    loop = _EpochLoopSharingTheSignalOnce.__new__(_EpochLoopSharingTheSignalOnce)
    strategy = SimpleNamespace(root_device=torch.device("cpu"))
    loop.trainer = SimpleNamespace(received_sigterm=False, strategy=strategy)
    with HostReads() as seen:
        for _ in range(5):  # five batches of one fit
            loop._broadcast_sigterm_tensor()
    assert dict(seen.collectives) == {"broadcast_": 1}
    loop.share_signal = True  # a new fit (ConvSeqDDPStrategy.on_train_start)
    loop.trainer.received_sigterm = True  # caught by Lightning's handler before training
    with pytest.raises(SIGTERMException):  # Lightning's own way out, on every rank
        loop._broadcast_sigterm_tensor()


def _per_update(tmp_path, tiny_data, name: str, strategy: str, *options: str) -> list[list[dict]]:
    """Each rank's host reads and collectives of every update of a 2-rank gloo run."""
    work = tmp_path / name
    cmd = ddp_script_command(
        tiny_data,
        work / "out",
        work / "record",
        "count_syncs=1",
        f"trainer.limit_train_batches={UPDATES}",
        *options,
    )
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=launch_env(), capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [torch.load(work / "record" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert [r["updates"] for r in ranks] == [UPDATES, UPDATES]
    assert [r["strategy"] for r in ranks] == [strategy, strategy]
    return [r["syncs"] for r in ranks]


@pytest.mark.slow
def test_two_gloo_ranks_make_two_broadcasts_one_barrier_and_one_read_fewer_per_update(
    tmp_path, tiny_data
):
    lightning = _per_update(tmp_path, tiny_data, "lightning", "DDPStrategy", "lightning_ddp=1")
    convseq = _per_update(tmp_path, tiny_data, "convseq", "ConvSeqDDPStrategy")
    for rank in (0, 1):
        before, after = lightning[rank], convseq[rank]
        # the flag's one broadcast of the fit, in the first update's window: made by both
        flag = "broadcast_ at pytorch_lightning/loops/training_epoch_loop.py (_broadcast_sigterm_tensor)"
        assert _sites(before[0])[flag] == _sites(after[0])[flag] == 1
        # updates 3 .. N-1: past the first updates' set-up collectives, before the epoch's end
        for b, a in zip(before[2:-1], after[2:-1]):
            dropped = Counter(b["collectives"]) - Counter(a["collectives"])
            # the flag's broadcast, DDP's buffer broadcast before the forward pass, the barrier
            assert dropped == Counter({"broadcast_": 2, "barrier": 1}), (b, a)
            assert Counter(a["collectives"]) - Counter(b["collectives"]) == Counter()
            assert "barrier" not in a["collectives"]
            reads = Counter(b["reads"]) - Counter(a["reads"])
            assert reads == Counter({"_local_scalar_dense": 1}), (b, a)  # the flag's .item()
            assert Counter(a["reads"]) - Counter(b["reads"]) == Counter()
    # what remains per update, for docs/gpu.md
    print("per update, rank 0, Lightning's:", lightning[0][2])
    print("per update, rank 0, convseq's:", convseq[0][2])


def _sites(window: dict) -> Counter:
    return Counter({re.sub(r":\d+ \(", " (", k): v for k, v in window["sites"].items()})


# slow: the default run covers an update's one device read (tests/training/test_host_syncs.py) and
# convseq's DDP collectives (the one-rank-group tests above)
@pytest.mark.slow
def test_two_gloo_ranks_read_the_device_once_an_update_with_the_bar_on(tmp_path, tiny_data):
    """convseq's DDP with the progress bar drawn: per update, the finite check is the one read
    of the device (a logging step adds the copy of its figures); the collectives are DDP's
    gradient all-reduce, the one of the update's sums, and the signal flag's (host memory)."""
    windows = _per_update(
        tmp_path,
        tiny_data,
        "bar",
        "ConvSeqDDPStrategy",
        "trainer.enable_progress_bar=true",
        "trainer.progress=bar",
        "trainer.log_every_n_steps=3",
        "final_test=false",
    )
    expected = Counter(
        {
            "tolist at convseq/training/module.py (configure_gradient_clipping)": 1,
            "allreduce_ at pytorch_lightning/core/module.py (backward)": 1,  # DDP's gradients
            "allreduce_ at convseq/training/strategy.py (reduce)": 1,  # the update's sums
            "allreduce_ (host) at convseq/training/signals.py (_agreed)": 1,  # signal flag
            "tolist at tests/ddp_script.py (on_train_batch_start)": 1,  # the test's own record
        }
    )
    for rank in (0, 1):
        # updates 3 .. N-1: past DDP's first-step collectives, before the epoch's end
        for update, window in enumerate(windows[rank][2:-1], start=3):
            seen = _sites(window)
            logged = seen.pop("cpu at convseq/training/metrics.py (on_host)", 0)
            assert seen == expected, (rank, update, seen)
            # update k's figures are logged after its window closes: in window k + 1
            assert logged == ((update - 1) % 3 == 0), (rank, update, seen)
