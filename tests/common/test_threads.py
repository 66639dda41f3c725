"""The thread rule (convseq.common.threads): precedence, affinity shared by the local processes,
LOCAL_WORLD_SIZE, Lightning's devices, a sweep job's share, the ranks found on one host."""

from __future__ import annotations

import pytest
import torch

from convseq.common import threads
from convseq.common.config import DeviceConfig, TrainerConfig
from convseq.common.threads import ThreadChoice, choose_threads, local_share
from convseq.errors import SettingError


@pytest.fixture
def eight_cpus(monkeypatch):
    """This process may run on 8 CPUs (whatever the machine has)."""
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)


def test_one_process_takes_its_affinity(eight_cpus):
    got = choose_threads(TrainerConfig(strategy="auto", devices=1), env={})
    assert got == ThreadChoice(8, "affinity 8 / 1 process")


def test_local_world_size_divides_the_affinity(eight_cpus):
    got = choose_threads(TrainerConfig(), env={"LOCAL_WORLD_SIZE": "2"})
    assert got == ThreadChoice(4, "affinity 8 / 2 local processes (LOCAL_WORLD_SIZE)")


def test_lightning_devices_divide_under_ddp_only(eight_cpus):
    assert choose_threads(TrainerConfig(strategy="ddp", devices=4), env={}).threads == 2
    assert choose_threads(TrainerConfig(strategy="ddp_spawn", devices=[0, 1]), env={}).threads == 4
    # one process, whatever devices says, without a ddp strategy
    assert choose_threads(TrainerConfig(strategy="auto", devices=4), env={}).threads == 8
    # the devices node of the tasks that translate reads the same
    assert choose_threads(DeviceConfig(strategy="ddp", devices=4), env={}).threads == 2


def test_never_below_one_thread(eight_cpus):
    assert choose_threads(TrainerConfig(), env={"LOCAL_WORLD_SIZE": "16"}).threads == 1


def test_precedence_config_then_omp_then_caller_then_rule(eight_cpus):
    env = {"LOCAL_WORLD_SIZE": "2"}
    assert choose_threads(
        TrainerConfig(threads=3), env=env, user_omp="5", caller=6
    ) == ThreadChoice(3, "trainer.threads")
    assert choose_threads(TrainerConfig(), env=env, user_omp="5", caller=6) == ThreadChoice(
        5, "OMP_NUM_THREADS"
    )
    assert choose_threads(TrainerConfig(), env=env, caller=6).threads == 6
    assert choose_threads(TrainerConfig(), env=env).threads == 4


def test_a_sweep_jobs_share(eight_cpus):
    got = choose_threads(TrainerConfig(), job_cpus=(2, "affinity 8 / 4 parallel jobs of X"), env={})
    assert got == ThreadChoice(2, "affinity 8 / 4 parallel jobs of X")
    # a DDP job of such a sweep shares its part between its processes
    two = choose_threads(TrainerConfig(strategy="ddp", devices=2), job_cpus=(4, "j"), env={})
    assert two.threads == 2 and "2 local processes" in two.source


@pytest.mark.parametrize("bad", [0, -1, "x"])
def test_bad_numbers_name_the_key(bad):
    with pytest.raises(SettingError, match="trainer.threads"):
        choose_threads(TrainerConfig(threads=bad), env={})
    with pytest.raises(SettingError, match="OMP_NUM_THREADS"):
        choose_threads(TrainerConfig(), env={}, user_omp=str(bad))


def test_ranks_on_one_host_share_its_cpus():
    """Two torchrun 'nodes' on one machine: each saw LOCAL_WORLD_SIZE=1."""
    first = ThreadChoice(8, "affinity 8 / 1 process")
    cpus = frozenset(range(8))
    got = local_share(first, [("h", cpus), ("h", cpus)], me=1)
    assert got == ThreadChoice(4, "affinity 8 / 2 processes of the run on this host")
    # other hosts, and ranks bound to other CPUs of this host, do not count
    bound = [("h", frozenset({0, 1})), ("h", frozenset({2, 3})), ("g", frozenset({0, 1}))]
    assert local_share(ThreadChoice(1, "affinity 2 / 2 x"), bound, me=0).threads == 2
    # a number the user chose stays
    mine = ThreadChoice(3, "trainer.threads")
    assert local_share(mine, [("h", cpus), ("h", cpus)], me=0) is mine


def test_caller_threads_and_apply(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_TORCH_DEFAULT", before)
    monkeypatch.setattr(threads, "_applied", None)
    try:
        assert threads.caller_threads() is None  # untouched
        other = 1 if before != 1 else 2
        torch.set_num_threads(other)
        assert threads.caller_threads() == other  # the caller changed it
        threads.apply_threads(ThreadChoice(other, "torch.set_num_threads by the caller"))
        assert threads.caller_threads() == other  # still the caller's, for the next run
        threads.apply_threads(ThreadChoice(other, "affinity 8 / 8 local processes (x)"))
        assert torch.get_num_threads() == other
        assert threads.caller_threads() is None  # the rule's own number is not the caller's
    finally:
        torch.set_num_threads(before)
