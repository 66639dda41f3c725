"""`python run.py -m hparams_search=...`: a real Optuna search through run.py, continued by the
same command; the study's bookkeeping (`convseq.cli.optuna_search`); the search spaces the
configs compose to."""

from __future__ import annotations

import csv
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from convseq.cli.hydra_callbacks import SweepReport
from convseq.cli.optuna_search import (
    OPTUNA_SWEEPER,
    SearchError,
    SearchInterrupted,
    check_search,
    continue_sampler,
    cut_short,
    resume_study,
)
from convseq.cli.schema import register_configs
from convseq.evaluation.report import REPORT_FILES
from tests.conftest import CONF_DIR, ROOT
from tests.training_utils import TINY_MODEL

optuna = pytest.importorskip("optuna")
pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")

STUDY = "toy_optuna"


def _search(tiny_data, tmp_path: Path, n_trials: int) -> subprocess.CompletedProcess:
    """The toy search with tiny trials (1 epoch of 3 updates), outputs under tmp_path."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "CONVSEQ_CACHE": str(tiny_data["cache"]),
        "CONVSEQ_OUTPUTS": str(tmp_path / "outputs"),
        "OMP_NUM_THREADS": "1",  # the machine is shared: one thread per job
    }
    cmd = [
        sys.executable,
        str(ROOT / "run.py"),
        "-m",
        "hparams_search=toy_optuna",
        "data.generator=null",
        f"data.dir={tiny_data['corpus']}",
        *TINY_MODEL,
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=2",
        f"hydra.sweeper.n_trials={n_trials}",
    ]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _jobs(sweep_dir: Path) -> list[str]:
    return sorted((p.name for p in sweep_dir.iterdir() if p.is_dir()), key=int)


def test_a_toy_search_reports_its_trials_best_first_and_continues_without_rerunning(
    tiny_data, tmp_path
):
    sweep_dir = tmp_path / "outputs" / "optuna" / STUDY  # fixed by the study's name
    proc = _search(tiny_data, tmp_path, n_trials=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"convseq: best trial: {sweep_dir / 'best_trial.yaml'}" in proc.stdout
    assert _jobs(sweep_dir) == ["0", "1", "2", "3"]
    summaries = {j: json.loads((sweep_dir / j / "summary.json").read_text()) for j in "0123"}
    values = {j: s["best_value"] for j, s in summaries.items()}
    assert all(s["optimized_metric"] == "valid/nll_loss" for s in summaries.values())
    assert len(set(values.values())) == 4  # four different trials

    # Optuna's own record: trial N ran in job folder N and got what that run returned
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    trials = study.get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 4
    for t in trials:
        overrides = OmegaConf.load(sweep_dir / str(t.number) / ".hydra" / "overrides.yaml")
        assert f"optim.lr={t.params['optim.lr']}" in overrides
        assert t.value == pytest.approx(values[str(t.number)])

    # the report: four rows ordered by the objective, the best trial and its overrides
    with open(sweep_dir / REPORT_FILES["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    best_first = sorted(values, key=values.get)
    assert [r["job"] for r in rows] == best_first
    assert [float(r["objective"]) for r in rows] == pytest.approx(sorted(values.values()))
    assert [r["rank"] for r in rows] == ["1", "2", "3", "4"]
    best_job = best_first[0]
    best = OmegaConf.to_container(OmegaConf.load(sweep_dir / "best_trial.yaml"))
    assert best["job"] == best_job == str(study.best_trial.number)
    assert best["value"] == pytest.approx(min(values.values()))
    job_overrides = list(OmegaConf.load(sweep_dir / best_job / ".hydra" / "overrides.yaml"))
    assert best["overrides"] == job_overrides
    assert sorted(o.split("=")[0] for o in best["params"]) == sorted(study.best_trial.params)
    md = (sweep_dir / REPORT_FILES["markdown"]).read_text()
    assert f"Best trial: job {best_job}, valid/nll_loss = {min(values.values()):.4f}." in md
    # the line pastes into a shell as the trial's own overrides
    line = next(x for x in md.splitlines() if x.startswith("best_overrides: `"))
    assert shlex.split(line.removeprefix("best_overrides: `").removesuffix("`")) == job_overrides
    assert shlex.split(best["command"]) == ["python", "run.py", *job_overrides]
    record = json.loads((sweep_dir / REPORT_FILES["json"]).read_text())
    assert record["search"]["direction"] == "minimize" and record["best"]["job"] == best_job

    # the same command again: the study is complete, nothing runs, nothing is rewritten
    stamps = {j: (sweep_dir / j / "summary.json").stat().st_mtime_ns for j in "0123"}
    proc = _search(tiny_data, tmp_path, n_trials=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Launching" not in proc.stdout + proc.stderr
    assert _jobs(sweep_dir) == ["0", "1", "2", "3"]
    assert {j: (sweep_dir / j / "summary.json").stat().st_mtime_ns for j in "0123"} == stamps
    assert len(study.get_trials()) == 4

    # one more trial asked for: it alone runs, as trial 4 in job folder 4
    proc = _search(tiny_data, tmp_path, n_trials=5)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _jobs(sweep_dir) == ["0", "1", "2", "3", "4"]
    trials = study.get_trials()
    assert [t.number for t in trials] == [0, 1, 2, 3, 4]
    # a new point: the seeded sampler does not replay the first run's draws
    assert all(trials[4].params != t.params for t in trials[:4])
    assert trials[4].value == pytest.approx(
        json.loads((sweep_dir / "4" / "summary.json").read_text())["best_value"]
    )
    with open(sweep_dir / REPORT_FILES["csv"], newline="") as f:
        assert sorted(r["job"] for r in csv.DictReader(f)) == ["0", "1", "2", "3", "4"]


# ---------------------------------------------------------------------------- the study's books


def _storage(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'sweep' / 'optuna.db'}"  # the folder does not exist yet


def test_resume_counts_finished_trials_and_fails_the_ones_left_running(tmp_path):
    storage = _storage(tmp_path)
    state = resume_study(storage, "s", "minimize", n_trials=4)
    assert (state.trials, state.done, state.stale, state.to_run) == (0, 0, 0, 4)
    study = optuna.load_study(study_name="s", storage=storage)
    for value in (1.0, 2.0):
        trial = study.ask()
        trial.suggest_float("x", 0.0, 1.0)
        study.tell(trial, value)
    study.ask()  # a trial whose process died: left RUNNING

    state = resume_study(storage, "s", "minimize", n_trials=4)
    assert (state.trials, state.done, state.stale, state.to_run) == (3, 2, 1, 2)
    fresh = optuna.load_study(study_name="s", storage=storage)  # not this process's cache
    states = [t.state for t in fresh.get_trials()]
    assert states[2] == optuna.trial.TrialState.FAIL  # no sampler waits for it
    state = resume_study(storage, "s", "minimize", n_trials=2)
    assert (state.stale, state.to_run) == (0, 0)  # complete: nothing more to run


def _proposals(sampler, study_trials: int, n: int) -> list[float]:
    """What a fresh in-memory study asks of `sampler` after continue_sampler(study_trials)."""
    continue_sampler(sampler, study_trials)
    study = optuna.create_study(sampler=sampler)
    return [study.ask().suggest_float("lr", 0.0, 1.0) for _ in range(n)]


def test_a_continued_sampler_draws_anew_and_the_same_way_each_time():
    tpe = optuna.samplers.TPESampler
    first = _proposals(tpe(seed=1), 0, 3)
    assert first == _proposals(tpe(seed=1), 0, 3)  # nothing changes for a new study
    again = _proposals(tpe(seed=1), 3, 3)
    assert again == _proposals(tpe(seed=1), 3, 3)  # deterministic
    assert not set(again) & set(first)  # and not the first run's draws
    assert _proposals(tpe(seed=1), 4, 3) != again  # the count of trials is part of the seed
    rnd = optuna.samplers.RandomSampler
    assert _proposals(rnd(seed=1), 2, 2) != _proposals(rnd(seed=1), 0, 2)
    continue_sampler(object(), 5)  # a sampler without a generator is left alone


def test_resume_refuses_a_storage_without_a_study_name(tmp_path):
    with pytest.raises(SearchError, match="study_name"):
        resume_study(_storage(tmp_path), None, "minimize", n_trials=3)
    assert resume_study(None, None, "minimize", n_trials=3).to_run == 3  # in memory: all


def test_a_trial_cut_short_by_a_signal_stops_the_search(tmp_path):
    from hydra.core.utils import JobReturn, JobStatus

    from hydra_plugins.convseq_optuna.resumable import _SignalAwareLauncher

    runs = {"ok": {"signal": None, "interrupted": False}, "cut": {"signal": "SIGTERM"}}
    for name, summary in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    assert cut_short(tmp_path / "ok") is None and cut_short(tmp_path / "cut") == "SIGTERM"

    class Launcher:
        def launch(self, job_overrides, initial_job_idx):
            returns = []
            for name in job_overrides:
                hydra_cfg = OmegaConf.create(
                    {"hydra": {"runtime": {"output_dir": str(tmp_path / name)}}}
                )
                returns.append(JobReturn(hydra_cfg=hydra_cfg, status=JobStatus.COMPLETED))
                returns[-1].return_value = 1.5
            return returns

    launcher = _SignalAwareLauncher(Launcher())
    ok, cut = launcher.launch(["ok", "cut"], initial_job_idx=0)
    assert ok.return_value == 1.5
    with pytest.raises(SearchInterrupted, match="Run the same command again"):
        cut.return_value  # noqa: B018 (the Optuna sweeper reads it: a failed trial, then stops)
    # a sweeper that tolerates failures (max_failure_rate > 0) gets no further trial run
    with pytest.raises(SearchInterrupted, match="SIGTERM ended the trial"):
        launcher.launch(["ok"], initial_job_idx=2)


# ---------------------------------------------------------------------------- the configs


def _compose(*overrides: str):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def test_the_multi30k_search_space_is_the_one_documented(monkeypatch, tmp_path):
    monkeypatch.setenv("CONVSEQ_OUTPUTS", str(tmp_path))
    cfg = _compose("hparams_search=multi30k_optuna")
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_ == OPTUNA_SWEEPER
    assert dict(sweeper.params) == {
        "optim.lr": "interval(0.1, 0.5)",
        "model.dropout": "interval(0.1, 0.4)",
        "criterion.label_smoothing": "interval(0.0, 0.2)",
        "batching.max_tokens": "choice(2000, 3000, 4000, 6000)",
    }
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler" and sweeper.sampler.seed == 1
    assert sweeper.direction == "maximize" and sweeper.study_name == "multi30k_optuna"
    assert cfg.hydra.sweep.dir == str(tmp_path / "optuna" / "multi30k_optuna")
    assert sweeper.storage == f"sqlite:///{tmp_path}/optuna/multi30k_optuna/optuna.db"
    # each trial is the shortened recipe on Multi30k, read on valid BLEU (never test)
    assert cfg.data.name == "multi30k" and cfg.model.arch == "fconv_iwslt_de_en"
    assert cfg.trainer.max_epochs == 9 and cfg.final_test is False
    assert (cfg.optimized_metric, cfg.checkpoint.monitor, cfg.checkpoint.mode) == (
        "valid/bleu",
        "valid/bleu",
        "max",
    )
    assert cfg.bleu_every_n_epochs == 1
    check_search(cfg)  # the direction agrees with what training returns


def test_the_toy_search_minimises_the_validation_loss():
    cfg = _compose("hparams_search=toy_optuna")
    assert cfg.hydra.sweeper.direction == "minimize" and cfg.optimized_metric == "valid/nll_loss"
    assert set(cfg.hydra.sweeper.params) == {
        "optim.lr",
        "model.dropout",
        "criterion.label_smoothing",
        "batching.max_tokens",
    }
    check_search(cfg)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # a loss searched upwards: training returns its smallest value
        (["hparams_search=toy_optuna", "hydra.sweeper.direction=maximize"], "the smallest"),
        # BLEU searched downwards: training returns its largest value
        (["hparams_search=multi30k_optuna", "hydra.sweeper.direction=minimize"], "largest value"),
        # BLEU searched upwards, but best.ckpt by loss: training would return the smallest BLEU
        (["hparams_search=multi30k_optuna", "checkpoint.monitor=valid/loss"], "the smallest"),
    ],
)
def test_a_direction_that_disagrees_with_training_is_refused(overrides, message, capsys):
    cfg = _compose(*overrides)
    with pytest.raises(SearchError, match=message):
        check_search(cfg)
    with pytest.raises(SystemExit) as e:  # the multirun stops before its first trial
        SweepReport().on_multirun_start(cfg)
    assert e.value.code == 2
    assert "convseq: error: hydra.sweeper.direction=" in capsys.readouterr().err
