"""A sweep job's share of the CPUs (convseq.common.parallel_jobs), from the launcher's settings
and the sweep's size."""

from __future__ import annotations

from convseq.common.parallel_jobs import job_cpus, sweep_size

SUBMITIT = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"
JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
BASIC_SWEEPER = {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"}


def test_sweep_size_counts_the_combinations():
    assert sweep_size(["optim=nag,sgd", "seed=1,2,3", "trainer.max_epochs=1"]) == 6
    assert sweep_size(["trainer.max_epochs=1"]) == 1


def test_submitit_local_shares_the_cpus_between_its_jobs():
    got = job_cpus({"_target_": SUBMITIT}, BASIC_SWEEPER, jobs_in_sweep=2, cpus=8)
    assert got == (4, "affinity 8 / 2 parallel jobs of hydra/launcher=submitit_local")
    # no more jobs at once than array_parallelism
    capped = {"_target_": SUBMITIT, "array_parallelism": 2}
    assert job_cpus(capped, BASIC_SWEEPER, jobs_in_sweep=8, cpus=8)[0] == 4


def test_submitit_local_cpus_per_task_wins():
    launcher = {"_target_": SUBMITIT, "cpus_per_task": 3}
    assert job_cpus(launcher, BASIC_SWEEPER, jobs_in_sweep=2, cpus=8)[0] == 3
    assert job_cpus(launcher, BASIC_SWEEPER, jobs_in_sweep=2, cpus=2)[0] == 2  # never more


def test_joblib_n_jobs():
    launcher = {"_target_": JOBLIB, "n_jobs": 10}
    assert job_cpus(launcher, BASIC_SWEEPER, jobs_in_sweep=2, cpus=8)[0] == 4
    assert job_cpus({"_target_": JOBLIB, "n_jobs": 2}, BASIC_SWEEPER, 8, cpus=8)[0] == 4
    assert job_cpus({"_target_": JOBLIB, "n_jobs": -1}, BASIC_SWEEPER, 16, cpus=8)[0] == 1


def test_optuna_runs_n_jobs_trials_at_once():
    optuna = {"_target_": "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"}
    got = job_cpus({"_target_": SUBMITIT}, {**optuna, "n_jobs": 2}, jobs_in_sweep=1, cpus=8)
    assert got[0] == 4


def test_other_launchers_leave_the_job_alone():
    basic = {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}
    assert job_cpus(basic, BASIC_SWEEPER, jobs_in_sweep=4, cpus=8) is None
