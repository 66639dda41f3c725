"""Threads that follow other work on the process's CPUs (convseq.common.cpu_share): the kernel's
counters read for this process's CPUs only, this process's own time left out, the number asked
for applied in the calling thread, and a choice of the user's never followed."""

from __future__ import annotations

import os
import time

import pytest
import torch

from convseq.common.cpu_share import CpuShare, busy_ticks, follows, free_threads, threads_line
from convseq.common.threads import ThreadChoice
from convseq.inference.cpu_share_callback import CpuShareCallback

HZ = os.sysconf("SC_CLK_TCK")


def stat(*per_cpu: tuple[int, int, int, int, int, int, int, int]) -> str:
    """/proc/stat's text: the total line, then one line per CPU (user nice system idle iowait irq
    softirq steal), then lines that are not CPUs."""
    total = [sum(col) for col in zip(*per_cpu)]
    lines = ["cpu  " + " ".join(map(str, total)) + " 0 0"]
    lines += [f"cpu{i} " + " ".join(map(str, f)) + " 0 0" for i, f in enumerate(per_cpu)]
    return "\n".join([*lines, "intr 12345 1 2", "ctxt 999", "procs_running 3"])


def test_busy_ticks_count_user_nice_system_irq_softirq_of_the_cpus_asked_only():
    text = stat((10, 1, 5, 1000, 7, 2, 3, 50), (100, 0, 0, 0, 0, 0, 0, 0), (1, 1, 1, 1, 1, 1, 1, 1))
    assert busy_ticks(text, {0}) == 10 + 1 + 5 + 2 + 3  # idle, iowait and steal left out
    assert busy_ticks(text, {0, 2}) == 21 + 5
    assert busy_ticks(text, {7}) is None  # not listed: nothing to say


@pytest.mark.parametrize(
    ("others", "cpus", "most", "threads"),
    [
        (0.0, 2, 2, 2),
        (0.4, 2, 2, 2),
        (0.6, 2, 2, 1),
        (1.0, 2, 2, 1),
        (3.0, 2, 2, 1),
        (1.0, 8, 8, 7),
        (2.6, 8, 8, 5),
        (0.0, 8, 4, 4),
    ],
)
def test_free_threads_are_the_cores_left_rounded_between_1_and_the_rules(
    others, cpus, most, threads
):
    assert free_threads(others, cpus, most) == threads


class Machine:
    """A 2-CPU machine's counters, moved by hand: wall seconds, busy ticks, own CPU seconds."""

    def __init__(self) -> None:
        self.t, self.ticks, self.own = 0.0, [0, 0], 0.0

    def run(self, seconds: float, own_cores: float, other_cores: float) -> None:
        self.t += seconds
        busy = (own_cores + other_cores) * seconds * HZ  # spread over the two CPUs
        self.ticks = [self.ticks[0] + int(busy / 2), self.ticks[1] + int(busy / 2)]
        self.own += own_cores * seconds

    def share(self) -> CpuShare:
        read = lambda: stat(*[(b, 0, 0, 0, 0, 0, 0, 0) for b in self.ticks])  # noqa: E731
        return CpuShare(2, {0, 1}, read=read, clock=lambda: self.t, own_cpu=lambda: self.own)


def test_another_busy_process_halves_the_threads_and_its_end_gives_them_back(one_thread):
    m = Machine()
    share = m.share()
    m.run(2.0, own_cores=2.0, other_cores=0.0)  # alone: its own time is not "other work"
    assert share.look() == 2 and share.step() is None
    m.run(2.0, own_cores=1.0, other_cores=1.0)  # a second run took a core
    assert share.look() == 1 and share.others == pytest.approx(1.0, abs=0.02)
    line = share.step()
    assert torch.get_num_threads() == 1
    assert line == "threads per process: 1 (other work uses 1.0 of the 2 CPUs of this process)"
    m.run(2.0, own_cores=1.0, other_cores=0.1)  # the other run ended, or paused
    assert share.look() == 1 and share.step() is None  # one look is not enough to go up
    m.run(2.0, own_cores=1.0, other_cores=0.1)
    assert share.look() == 2  # two in a row are
    assert share.step() == "threads per process: 2 again (the other work on these 2 CPUs stopped)"
    assert torch.get_num_threads() == 2
    m.run(2.0, own_cores=1.0, other_cores=1.0)
    share.look()
    share.step()
    share.stop()  # gives the rule's number back to the thread that ran the work
    assert torch.get_num_threads() == 2


def test_without_proc_stat_nothing_changes():
    share = CpuShare(2, {0, 1}, read=lambda: None)
    assert share.look() == 2 and share.step() is None
    assert share.start()._thread is None  # no watcher for what cannot be read


def test_only_a_number_the_rule_made_of_several_threads_follows():
    assert follows("affinity 2 / 1 process", 2)
    assert not follows("affinity 2 / 2 local processes (trainer.devices)", 1)
    for mine in ("trainer.threads", "OMP_NUM_THREADS", "torch.set_num_threads by the caller"):
        assert not follows(mine, 2)
        assert threads_line(2, mine) == f"threads per process: 2 ({mine})"
        assert CpuShareCallback(ThreadChoice(2, mine)).share is None
    assert threads_line(2, "affinity 2 / 1 process").startswith(
        "threads per process: 2 (affinity 2 / 1 process); fewer while other work uses these CPUs"
    )


def test_the_watcher_thread_looks_by_itself_and_stops(one_thread):
    m = Machine()
    share = CpuShare(
        2,
        {0, 1},
        every=0.01,
        read=lambda: stat(*[(b, 0, 0, 0, 0, 0, 0, 0) for b in m.ticks]),
        clock=lambda: m.t,
        own_cpu=lambda: m.own,
    )
    m.run(2.0, own_cores=1.0, other_cores=1.0)
    share.start()
    try:
        deadline = time.monotonic() + 10
        while share.wanted != 1 and time.monotonic() < deadline:  # looks come every 0.01 s
            time.sleep(0.005)
        assert share.wanted == 1
    finally:
        share.stop()
    assert share._thread is None


def test_training_and_generation_callbacks_apply_the_number_between_steps(one_thread, caplog):
    from types import SimpleNamespace

    from convseq.training.thread_share import ThreadShare

    cb = ThreadShare(ThreadChoice(2, "affinity 2 / 1 process"))
    trainer = SimpleNamespace(world_size=1, global_rank=0)
    cb.setup(trainer, None, "fit")  # applies the rule's 2, then follows
    try:
        assert torch.get_num_threads() == 2 and cb.share is not None
        cb.share.wanted, cb.share.others = 1, 1.0  # as a look would set them
        with caplog.at_level("INFO", logger="convseq.train"):
            cb.on_train_batch_start(trainer, None, {}, 0)
        assert torch.get_num_threads() == 1
        assert "threads per process: 1 (other work uses 1.0 of the 2 CPUs" in caplog.text
    finally:
        cb.teardown(trainer, None, "fit")
    assert cb.share is None and torch.get_num_threads() == 2  # the rule's number again
    said: list[str] = []
    gen = CpuShareCallback(ThreadChoice(2, "affinity 2 / 1 process"), say=said.append)
    gen.share.wanted, gen.share.others = 1, 1.3
    gen.on_predict_batch_start(trainer, None, {}, 0)
    gen.teardown(trainer, None, "predict")
    assert said == ["threads per process: 1 (other work uses 1.3 of the 2 CPUs of this process)"]
