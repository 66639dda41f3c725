"""Preemption and requeue as on SLURM, on one machine: `python run.py` under the environment
SLURM gives a job's task (Lightning's SLURMEnvironment takes over), with an `scontrol` stand-in
first on PATH that records its arguments.

- SIGUSR1 (`#SBATCH --signal=USR1@120`) early in epoch 2: convseq saves checkpoints/last.ckpt at
  the end of the update, asks for `scontrol requeue <job id>` and exits with 75; Lightning writes
  no `hpc_ckpt_*.ckpt`. The same command again continues and ends with the uninterrupted run's
  weights, bit for bit.
- SIGTERM (a cancelled job, slow): last.ckpt and 75 as before, and no requeue.
- A new run in a folder holding Lightning's `hpc_ckpt_*.ckpt` is refused, naming the file.
- Two tasks (slow): SIGUSR1 to the second one only stops both at the same update, and rank 0
  alone asks for the requeue.
"""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path

import pytest

from convseq.errors import CheckpointError
from convseq.training import slurm
from tests.training.run_py import (
    assert_same_weights,
    finish,
    free_port,
    signal_in_epoch_2,
    start,
)
from tests.training_utils import launch_env, tiny_config

JOB_ID = "4242"


def slurm_variables(job_id: str = JOB_ID) -> dict[str, str]:
    """What SLURM sets for the one task of a one-node job (`srun` inside `sbatch`)."""
    return {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_NAME": "fconv",  # "bash" or "interactive" would make Lightning ignore SLURM
        "SLURM_NTASKS": "1",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_NNODES": "1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NODELIST": "localhost",
    }


def scontrol_stand_in(folder: Path, status: int = 0) -> Path:
    """An `scontrol` in `folder` that appends its arguments to folder/calls and exits `status`;
    returns the record file."""
    folder.mkdir(parents=True, exist_ok=True)
    record = folder / "calls"
    script = folder / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{record}"\nexit {status}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return record


def job_env(tiny_data, bin_dir: Path) -> dict[str, str]:
    """The subprocess environment of a SLURM task, the stand-in first on PATH."""
    return launch_env(
        CONVSEQ_CACHE=str(tiny_data["cache"]),
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        **slurm_variables(),
    )


def calls(record: Path) -> list[str]:
    return record.read_text().splitlines() if record.exists() else []


def test_sigusr1_saves_requeues_and_the_same_command_continues_to_the_straight_weights(
    tiny_data, tmp_path
):
    record = scontrol_stand_in(tmp_path / "bin")
    env = job_env(tiny_data, tmp_path / "bin")
    straight, job = tmp_path / "straight", tmp_path / "job"
    # the job script's one command, for the first launch and every requeue
    command = ("resume=auto",)

    # the uninterrupted run, and (at the same time: two cores) the one SIGUSR1 stops
    first = start(tiny_data, straight, *command, env=env)
    proc = start(tiny_data, job, *command, env=env)
    signal_in_epoch_2(proc, job, signal.SIGUSR1)
    printed = finish(proc, 75)  # cut short by a signal: EX_TEMPFAIL, as after SIGTERM
    finish(first)
    assert calls(record) == [f"requeue {JOB_ID}"]  # the finished run asked for none
    assert f"asked SLURM to requeue job {JOB_ID}" in printed
    summary = json.loads((job / "summary.json").read_text())
    assert summary["signal"] == "SIGUSR1" and summary["interrupted"]
    assert "SIGUSR1 during epoch 2" in summary["stop_reason"]
    # one checkpoint to continue from: convseq's last.ckpt, none of Lightning's hpc_ckpt_N
    assert list(job.rglob(slurm.HPC_PATTERN)) == []
    assert (job / "checkpoints" / "last.ckpt").exists()

    finish(start(tiny_data, job, *command, env=env))  # the requeued job: the same command
    assert calls(record) == [f"requeue {JOB_ID}"]  # no second requeue
    done = json.loads((job / "summary.json").read_text())
    assert done["resumed_from"] == str(job / "checkpoints" / "last.ckpt")
    assert done["signal"] is None and done["epochs"] == 2
    assert_same_weights(straight, job)


# slow: a signal's exit 75 and last.ckpt under SLURM are the SIGUSR1 test's above, SIGTERM mid-epoch
# tests/training/test_ddp_resume.py's; which signal asks for a requeue: test_the_job_to_requeue_...
@pytest.mark.slow
def test_a_cancelled_job_saves_and_exits_75_without_a_requeue(tiny_data, tmp_path):
    record = scontrol_stand_in(tmp_path / "bin")
    env = job_env(tiny_data, tmp_path / "bin")
    cancelled_dir = tmp_path / "cancelled"
    cancelled = start(tiny_data, cancelled_dir, "resume=auto", env=env)
    signal_in_epoch_2(cancelled, cancelled_dir, signal.SIGTERM)
    finish(cancelled, 75)
    assert calls(record) == []  # a cancelled job asks for no requeue
    assert (cancelled_dir / "checkpoints" / "last.ckpt").exists()
    assert json.loads((cancelled_dir / "summary.json").read_text())["signal"] == "SIGTERM"


def test_a_new_run_in_a_folder_with_lightnings_hpc_checkpoint_is_refused(
    tiny_data, tmp_path, monkeypatch
):
    from convseq.tasks.train import train

    for key, value in slurm_variables().items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "run"
    out.mkdir()
    (out / "hpc_ckpt_1.ckpt").write_bytes(b"left by Lightning's own requeue handler")
    with pytest.raises(CheckpointError) as e:
        train(tiny_config(tiny_data, out, "resume=auto"))
    message = str(e.value)
    assert message.startswith(str(out / "hpc_ckpt_1.ckpt"))
    assert "checkpoints/last.ckpt" in message and "hydra.run.dir" in message


def test_the_job_to_requeue_and_a_failing_scontrol(tmp_path, monkeypatch):
    for key, value in slurm_variables().items():
        monkeypatch.setenv(key, value)
    assert slurm.slurm_job_id() == JOB_ID
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert slurm.slurm_job_id() == "77_3"  # an array task is requeued by its own id

    record = scontrol_stand_in(tmp_path / "bin", status=1)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    line = slurm.request_requeue()
    assert calls(record) == ["requeue 77_3"]
    assert "exited with 1" in line and "requeue the job yourself" in line

    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")  # Lightning's sign that it is no job
    assert slurm.requeue_signal() is None and slurm.cluster_plugins() == []


DDP_TASKS = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]


def two_tasks(tiny_data, out: Path, bin_dir: Path, port: int) -> list:
    """The two tasks `srun` starts for `--ntasks-per-node=2` on one node, each `python run.py`."""
    procs = []
    for rank in (0, 1):
        env = job_env(tiny_data, bin_dir)
        env.update(
            SLURM_NTASKS="2",
            SLURM_NTASKS_PER_NODE="2",
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            MASTER_ADDR="127.0.0.1",  # SLURM_NODELIST's first node, as Lightning would take it
            MASTER_PORT=str(port),
        )
        procs.append(start(tiny_data, out, *DDP_TASKS, "resume=auto", env=env))
    return procs


@pytest.mark.slow
def test_sigusr1_to_one_task_of_two_stops_both_and_rank_0_requeues(tiny_data, tmp_path):
    """`pytest -m slow tests/training/test_slurm_requeue.py`: the ranks agree on the requeue
    signal whichever task SLURM's signal reached first."""
    record = scontrol_stand_in(tmp_path / "bin")
    straight, job = tmp_path / "straight", tmp_path / "job"
    for task in two_tasks(tiny_data, straight, tmp_path / "bin", free_port()):
        finish(task)

    rank0, rank1 = two_tasks(tiny_data, job, tmp_path / "bin", free_port())
    signal_in_epoch_2(rank1, job, signal.SIGUSR1)  # to the second task only
    printed = finish(rank0, 75) + finish(rank1, 0)  # rank 0's status is the job's
    assert calls(record) == [f"requeue {JOB_ID}"]  # once, by rank 0
    assert printed.count("asked SLURM to requeue") == 1
    summary = json.loads((job / "summary.json").read_text())
    assert summary["signal"] == "SIGUSR1" and summary["interrupted"]
    assert list(job.rglob(slurm.HPC_PATTERN)) == []

    for task in two_tasks(tiny_data, job, tmp_path / "bin", free_port()):
        finish(task)
    assert calls(record) == [f"requeue {JOB_ID}"]
    assert_same_weights(straight, job)
    # srun's second task logs to its own file and writes no .hydra/ of its own
    assert "GLOBAL_RANK: 1" in (job / "train_node0_process_1.log").read_text()
