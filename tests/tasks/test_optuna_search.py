"""`python run.py -m hparams_search=...`: a real Optuna search through run.py, continued by the
same command; the study's bookkeeping (`convseq.cli.optuna_search`); the search spaces the
configs compose to."""

from __future__ import annotations

import csv
import json
import os
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from convseq.cli import optuna_search
from convseq.cli.hydra_callbacks import SweepReport
from convseq.cli.optuna_search import (
    OPTUNA_SWEEPER,
    SearchError,
    SearchInterrupted,
    check_search,
    continue_sampler,
    cut_short,
    recorded_settings,
    resume_study,
    settings_difference,
    study_settings,
)
from convseq.cli.schema import register_configs
from convseq.evaluation.report import REPORT_FILES
from tests.conftest import CONF_DIR, ROOT
from tests.training_utils import TINY_MODEL

optuna = pytest.importorskip("optuna")
pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")

STUDY = "toy_optuna"


def _search(
    tiny_data, tmp_path: Path, n_trials: int, *extra: str, reverse: bool = False
) -> subprocess.CompletedProcess:
    """The toy search with tiny trials (1 epoch of 3 updates), outputs under tmp_path; `extra`
    overrides, and `reverse` gives the overrides in the opposite order."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "CONVSEQ_CACHE": str(tiny_data["cache"]),
        "CONVSEQ_OUTPUTS": str(tmp_path / "outputs"),
        "OMP_NUM_THREADS": "1",  # the machine is shared: one thread per job
    }
    overrides = [
        "hparams_search=toy_optuna",
        "data.generator=null",
        f"data.dir={tiny_data['corpus']}",
        *TINY_MODEL,
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=2",
        f"hydra.sweeper.n_trials={n_trials}",
        *extra,
    ]
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", *(overrides[::-1] if reverse else overrides)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file below `folder`: its size and time of last change."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


def _jobs(sweep_dir: Path) -> list[str]:
    return sorted((p.name for p in sweep_dir.iterdir() if p.is_dir()), key=int)


def test_a_toy_search_reports_its_trials_best_first_and_continues_without_rerunning(
    tiny_data, tmp_path
):
    sweep_dir = tmp_path / "outputs" / "optuna" / STUDY  # fixed by the study's name
    proc = _search(tiny_data, tmp_path, 3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"convseq: best trial: {sweep_dir / 'best_trial.yaml'}" in proc.stdout
    assert "setup plugin" not in proc.stdout + proc.stderr  # alembic's lines, kept quiet
    assert _jobs(sweep_dir) == ["0", "1", "2"]
    summaries = {j: json.loads((sweep_dir / j / "summary.json").read_text()) for j in "012"}
    values = {j: s["best_value"] for j, s in summaries.items()}
    assert all(s["optimized_metric"] == "valid/nll_loss" for s in summaries.values())
    assert len(set(values.values())) == 3  # three different trials

    # Optuna's own record: trial N ran in job folder N and got what that run returned
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    trials = study.get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    for t in trials:
        overrides = OmegaConf.load(sweep_dir / str(t.number) / ".hydra" / "overrides.yaml")
        assert f"optim.lr={t.params['optim.lr']}" in overrides
        assert t.value == pytest.approx(values[str(t.number)])

    # the report: three rows ordered by the objective, the best trial and its overrides
    with open(sweep_dir / REPORT_FILES["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    best_first = sorted(values, key=values.get)
    assert [r["job"] for r in rows] == best_first
    assert [float(r["objective"]) for r in rows] == pytest.approx(sorted(values.values()))
    assert [r["rank"] for r in rows] == ["1", "2", "3"]
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
    stamps = {j: (sweep_dir / j / "summary.json").stat().st_mtime_ns for j in "012"}
    proc = _search(tiny_data, tmp_path, 3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Launching" not in proc.stdout + proc.stderr
    assert _jobs(sweep_dir) == ["0", "1", "2"]
    assert {j: (sweep_dir / j / "summary.json").stat().st_mtime_ns for j in "012"} == stamps
    assert len(study.get_trials()) == 3

    # other fixed settings: refused in one line before anything runs or is written
    files = _files(sweep_dir)
    proc = _search(tiny_data, tmp_path, 4, "max_update=20", "optim=sgd")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"convseq: error: optuna study '{STUDY}' was run with max_update=(default) "
        "optim=(default); this command has max_update=20 optim=sgd: run it as a new study "
        "with hydra.sweeper.study_name=NEW, or repeat the first command's settings"
    )
    assert "Launching" not in proc.stdout + proc.stderr
    assert _files(sweep_dir) == files
    assert len(study.get_trials()) == 3

    # one more trial asked for, the overrides in another order: it alone runs, as trial 3 in
    # job folder 3
    proc = _search(tiny_data, tmp_path, 4, reverse=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _jobs(sweep_dir) == ["0", "1", "2", "3"]
    trials = study.get_trials()
    assert [t.number for t in trials] == [0, 1, 2, 3]
    # a new point: the seeded sampler does not replay the first run's draws
    assert all(trials[3].params != t.params for t in trials[:3])
    assert trials[3].value == pytest.approx(
        json.loads((sweep_dir / "3" / "summary.json").read_text())["best_value"]
    )
    with open(sweep_dir / REPORT_FILES["csv"], newline="") as f:
        assert sorted(r["job"] for r in csv.DictReader(f)) == ["0", "1", "2", "3"]


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


def test_settings_differ_by_the_keys_named_with_their_values_in_any_order():
    recorded = {"max_update": "40", "optim": "nag", "data.dir": "toy"}
    assert (
        settings_difference(recorded, {"data.dir": "toy", "optim": "nag", "max_update": "40"})
        is None
    )
    assert settings_difference(
        recorded, {"optim": "sgd", "data.dir": "toy", "max_update": "20"}
    ) == ("was run with max_update=40 optim=nag; this command has max_update=20 optim=sgd")
    # a key given on one side only: the other side ran with the config's default
    assert settings_difference(recorded, {"optim": "nag", "max_update": "40", "seed": "2"}) == (
        "was run with data.dir=toy seed=(default); this command has data.dir=(default) seed=2"
    )


def _raise(error: Exception):
    def raising(*args, **kwargs):
        raise error

    return raising


def test_a_study_records_its_settings_and_refuses_others_before_touching_its_trials(
    tmp_path, monkeypatch
):
    storage = _storage(tmp_path)
    assert recorded_settings(storage, "s") is None  # no file yet, and none is created to look
    assert not (tmp_path / "sweep").exists()
    first = {"max_update": "40", "optim": "nag"}
    resume_study(storage, "s", "minimize", n_trials=2, settings=first)
    assert recorded_settings(storage, "s") == first
    assert recorded_settings(storage, "other") is None  # another study in the same storage
    with monkeypatch.context() as m:  # tables laid out otherwise: Optuna reads the record
        m.setattr(optuna_search, "_sqlite_record", _raise(sqlite3.OperationalError("no table")))
        assert recorded_settings(storage, "s") == first
    optuna.load_study(study_name="s", storage=storage).ask()  # a trial whose process died

    with pytest.raises(SearchError) as e:
        resume_study(
            storage, "s", "minimize", n_trials=3, settings={"max_update": "20", "optim": "nag"}
        )
    assert str(e.value) == (
        "optuna study 's' was run with max_update=40; this command has max_update=20: run it as "
        "a new study with hydra.sweeper.study_name=NEW, or repeat the first command's settings"
    )
    study = optuna.load_study(study_name="s", storage=storage)
    assert [t.state for t in study.get_trials()] == [optuna.trial.TrialState.RUNNING]  # untouched
    assert study.user_attrs["convseq_overrides"] == first

    state = resume_study(
        storage, "s", "minimize", n_trials=3, settings={"optim": "nag", "max_update": "40"}
    )
    assert (state.stale, state.to_run) == (1, 3)  # the same settings in another order go on


def test_the_fixed_settings_leave_out_the_search_space_and_the_sweep_controls():
    params = OmegaConf.load(CONF_DIR / "hparams_search" / "toy_optuna.yaml").hydra.sweeper.params
    task = [
        "hparams_search=toy_optuna",
        "max_update=20",
        "optim=sgd",
        "optim.momentum=0.90",  # as Hydra reads it: 0.9
        "optim.lr=0.1",  # a searched parameter, fixed
        "model.dropout=interval(0.1, 0.2)",  # a narrower range for one
        "+seed_offset=interval(1, 3)",  # a new searched parameter
    ]
    hydra = [
        "hydra.mode=MULTIRUN",
        "hydra.sweeper.n_trials=12",
        "hydra.sweeper.n_jobs=2",
        "hydra.sweeper.max_failure_rate=0.5",
        "hydra.sweeper.sampler.seed=7",
        "hydra.sweeper.params.criterion.label_smoothing='interval(0.0, 0.1)'",
        "hydra.sweeper.study_name=toy",
        "hydra.sweep.dir=elsewhere",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "hydra.verbose=true",
        "hydra.sweeper.direction=minimize",  # counts: it says what a trial's value means
        "hydra.job.env_set.CONVSEQ_CACHE=/tmp/c",  # counts: the trials' environment
    ]
    cfg = OmegaConf.create(
        {"hydra": {"sweeper": {"params": params}, "overrides": {"task": task, "hydra": hydra}}}
    )
    assert study_settings(cfg) == {
        "hparams_search": "toy_optuna",
        "max_update": "20",
        "optim": "sgd",
        "optim.momentum": "0.9",
        "hydra.sweeper.direction": "minimize",
        "hydra.job.env_set.CONVSEQ_CACHE": "/tmp/c",
    }


def test_continuing_a_study_with_other_settings_is_refused_unless_it_is_a_new_study(
    monkeypatch, tmp_path, capsys
):
    monkeypatch.setenv("CONVSEQ_OUTPUTS", str(tmp_path))
    # the study of `python run.py -m hparams_search=toy_optuna max_update=40 optim=nag`
    db = tmp_path / "optuna" / "toy_optuna" / "optuna.db"
    first = {"hparams_search": "toy_optuna", "max_update": "40", "optim": "nag"}
    resume_study(f"sqlite:///{db}", "toy_optuna", "minimize", 4, settings=first)
    stamp = db.stat().st_mtime_ns

    # the same settings in another order, more trials: the study goes on
    check_search(
        _compose(
            "optim=nag", "hydra.sweeper.n_trials=8", "max_update=40", "hparams_search=toy_optuna"
        )
    )
    other = _compose("hparams_search=toy_optuna", "max_update=20", "optim=sgd")
    with pytest.raises(
        SearchError,
        match="was run with max_update=40 optim=nag; this command has max_update=20 optim=sgd",
    ):
        check_search(other)
    with pytest.raises(SystemExit) as e:  # the multirun stops before its first trial
        SweepReport().on_multirun_start(other)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("convseq: error: optuna study 'toy_optuna' was run")
    assert db.stat().st_mtime_ns == stamp  # the study was read, not written

    # a new study name: a study of its own, in a folder of its own
    new = _compose(
        "hparams_search=toy_optuna",
        "max_update=20",
        "optim=sgd",
        "hydra.sweeper.study_name=toy_sgd",
    )
    check_search(new)
    assert new.hydra.sweep.dir == str(tmp_path / "optuna" / "toy_sgd")
    assert not (tmp_path / "optuna" / "toy_sgd").exists()  # looked for, not created


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


def test_the_toy_search_minimises_the_validation_loss(monkeypatch, tmp_path):
    monkeypatch.setenv("CONVSEQ_OUTPUTS", str(tmp_path))  # no study of a search run here
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
def test_a_direction_that_disagrees_with_training_is_refused(
    overrides, message, capsys, monkeypatch, tmp_path
):
    monkeypatch.setenv("CONVSEQ_OUTPUTS", str(tmp_path))
    cfg = _compose(*overrides)
    with pytest.raises(SearchError, match=message):
        check_search(cfg)
    with pytest.raises(SystemExit) as e:  # the multirun stops before its first trial
        SweepReport().on_multirun_start(cfg)
    assert e.value.code == 2
    assert "convseq: error: hydra.sweeper.direction=" in capsys.readouterr().err
