"""Which processes of a multi-process launch keep Hydra's files out of the shared run folder
(`convseq.cli.rank_args`); the launches themselves run in tests/training/test_multinode.py."""

from __future__ import annotations

from convseq.cli.rank_args import launch_position, rank_args

ARGV = ["trainer=ddp", "hydra.run.dir=/shared/run"]
OWN = ["hydra.output_subdir=null"]


def test_the_first_process_and_plain_runs_keep_their_command_line():
    assert rank_args(ARGV, {}) == ARGV
    torchrun_0 = {"TORCHELASTIC_RUN_ID": "x", "GROUP_RANK": "0", "LOCAL_RANK": "0", "RANK": "0"}
    assert rank_args(ARGV, torchrun_0) == ARGV
    assert rank_args(ARGV, {"NODE_RANK": "0"}) == ARGV
    assert rank_args(ARGV, {"SLURM_NTASKS": "8", "SLURM_NODEID": "0", "SLURM_LOCALID": "0"}) == ARGV


def test_every_other_process_gets_its_own_log_and_no_hydra_folder():
    torchrun = {"TORCHELASTIC_RUN_ID": "x", "GROUP_RANK": "1", "LOCAL_RANK": "0", "RANK": "1"}
    assert rank_args(ARGV, torchrun) == [*ARGV, *OWN, "hydra.job.name=train_node1_process_0"]
    local = {"TORCHELASTIC_RUN_ID": "x", "GROUP_RANK": "0", "LOCAL_RANK": "1", "RANK": "1"}
    assert rank_args(ARGV, local)[-1] == "hydra.job.name=train_node0_process_1"
    slurm = {"SLURM_NTASKS": "8", "SLURM_NODEID": "1", "SLURM_LOCALID": "3", "SLURM_JOB_NAME": "j"}
    assert rank_args(ARGV, slurm)[-1] == "hydra.job.name=train_node1_process_3"
    assert rank_args(ARGV, {"NODE_RANK": "1"})[-1] == "hydra.job.name=train_node1_process_0"


def test_lightnings_own_processes_keep_their_names_on_node_0_only():
    lightning = [*ARGV, "hydra.job.name=train_ddp_process_1", "hydra.output_subdir=null"]
    assert rank_args(lightning, {"LOCAL_RANK": "1"}) == lightning  # one machine: Lightning's
    assert rank_args(lightning, {"NODE_RANK": "0", "LOCAL_RANK": "1"}) == lightning
    # on node 1 Lightning's train_ddp_process_1.log would be node 0's file too
    moved = rank_args(lightning, {"NODE_RANK": "1", "LOCAL_RANK": "1"})
    assert moved == [*ARGV, *OWN, "hydra.job.name=train_node1_process_1"]


def test_an_interactive_slurm_shell_is_no_launch():
    slurm = {"SLURM_NTASKS": "1", "SLURM_NODEID": "2", "SLURM_JOB_NAME": "interactive"}
    assert launch_position(slurm) is None
