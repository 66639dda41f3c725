"""The sweep report of an Optuna search (`convseq.evaluation.search_report`), on job folders laid
out as a search leaves them: a maximised objective, a failed and an interrupted trial, and a
grid sweep left as it was."""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from convseq.errors import DataError
from convseq.evaluation.report import REPORT_FILES, write_report
from convseq.evaluation.search_report import BEST_FILE, optuna_search
from convseq.evaluation.sweep_jobs import load_job

SWEEPER = {
    "_target_": "hydra_plugins.convseq_optuna.resumable.ResumableOptunaSweeper",
    "direction": "maximize",
    "study_name": "bleu_search",
    "storage": "sqlite:///${hydra.sweep.dir}/optuna.db",
    "params": {"optim.lr": "interval(0.1, 0.5)", "model.dropout": "interval(0.1, 0.4)"},
}


def _job(
    root: Path,
    name: str,
    overrides: list[str],
    bleu: list[float] | None,
    sweeper: dict | None = SWEEPER,
    **summary: object,
) -> None:
    """A job folder: its overrides, hydra.yaml (the sweeper) and, unless `bleu` is None (the
    trial failed), a summary.json whose best_value is the best valid BLEU."""
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), job / ".hydra" / "overrides.yaml")
    hydra = {"hydra": {"sweeper": sweeper or {"_target_": "hydra._internal.BasicSweeper"}}}
    OmegaConf.save(OmegaConf.create(hydra), job / ".hydra" / "hydra.yaml")
    if bleu is None:
        return
    history = [
        {"epoch": i + 1, "valid/loss": 5.0 - i, "valid/bleu": b, "train_epoch/lr": 0.1}
        for i, b in enumerate(bleu)
    ]
    record = {
        "epochs": len(bleu),
        "updates": 10 * len(bleu),
        "train_seconds": 3.0,
        "seconds_per_epoch": 1.5,
        "stop_reason": "reached trainer.max_epochs",
        "interrupted": False,
        "signal": None,
        "optimized_metric": "valid/bleu",
        "best_value": max(bleu),
        "history": history,
        **summary,
    }
    (job / "summary.json").write_text(json.dumps(record))


def _search(root: Path) -> None:
    common = ["hparams_search=bleu", "model.encoder_layers=[[16,3]]"]
    _job(root, "0", ["optim.lr=0.2", "model.dropout=0.3", *common], [10.0, 12.5])
    _job(root, "1", ["optim.lr=0.4", "model.dropout=0.1", *common], [20.0, 18.0])
    _job(root, "2", ["optim.lr=0.3", "model.dropout=0.2", *common], None)  # failed
    # the best BLEU of all, but a signal cut it short: the study counts it failed
    _job(root, "3", ["optim.lr=0.5", "model.dropout=0.2", *common], [30.0], signal="SIGTERM")
    _job(root, "10", ["optim.lr=0.1", "model.dropout=0.4", *common], [15.0])


def test_an_optuna_search_is_reported_best_first_with_its_best_trial(tmp_path):
    _search(tmp_path)
    files = write_report(tmp_path, plot=False)
    with open(files["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    # maximised: 20.0, 15.0, 12.5, then the trials without a value in job order
    assert [r["job"] for r in rows] == ["1", "10", "0", "2", "3"]
    assert [r["objective"] for r in rows] == ["20.0", "15.0", "12.5", "", ""]
    assert [r["rank"] for r in rows] == ["1", "2", "3", "", ""]
    assert [r["status"] for r in rows][3:] == [
        "no summary.json (failed or still running)",
        "interrupted",
    ]

    best = OmegaConf.to_container(OmegaConf.load(files["best"]))
    assert files["best"] == tmp_path / BEST_FILE
    assert best["job"] == "1" and best["value"] == 20.0 and best["direction"] == "maximize"
    overrides = ["optim.lr=0.4", "model.dropout=0.1", "hparams_search=bleu"]
    overrides.append("model.encoder_layers=[[16,3]]")
    assert best["overrides"] == overrides
    assert best["params"] == ["optim.lr=0.4", "model.dropout=0.1"]  # the searched keys only
    assert shlex.split(best["command"]) == ["python", "run.py", *overrides]
    assert shlex.split(best["params_command"]) == ["python", "run.py", *best["params"]]

    md = files["markdown"].read_text()
    assert "Optuna search `bleu_search`: 5 trials" in md
    assert "Best trial: job 1, valid/bleu = 20.0000." in md
    assert "best_overrides: `optim.lr=0.4 model.dropout=0.1 hparams_search=bleu " in md
    assert "'model.encoder_layers=[[16,3]]'`" in md  # quoted for the shell
    assert "| job | valid/bleu (maximize) | overrides |" in md
    table = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    assert [line.split(" | ")[0] for line in table[1:]] == ["| 1", "| 10", "| 0", "| 2", "| 3"]

    record = json.loads(files["json"].read_text())
    assert record["search"]["study_name"] == "bleu_search"
    assert record["search"]["params"] == ["optim.lr", "model.dropout"]
    assert record["best"]["job"] == "1"
    assert [r["job"] for r in record["rows"]] == ["1", "10", "0", "2", "3"]
    assert [c["job"] for c in record["curves"]] == ["1", "10", "0", "2", "3"]


def test_a_minimised_search_puts_the_smallest_first(tmp_path):
    sweeper = {**SWEEPER, "direction": "minimize"}
    for name, bleu in (("0", [3.0]), ("1", [1.0]), ("2", [2.0])):
        _job(tmp_path, name, [f"optim.lr=0.{name}1"], bleu, sweeper=sweeper)
    files = write_report(tmp_path, plot=False)
    record = json.loads(files["json"].read_text())
    assert [r["job"] for r in record["rows"]] == ["1", "2", "0"]
    assert record["best"]["value"] == 1.0


def test_a_search_without_a_finished_trial_names_no_best(tmp_path):
    _job(tmp_path, "0", ["optim.lr=0.2"], None)
    files = write_report(tmp_path, plot=False)
    assert "best" not in files and not (tmp_path / BEST_FILE).exists()
    assert "No trial has finished with a value yet." in files["markdown"].read_text()
    assert json.loads(files["json"].read_text())["best"] is None


def test_a_grid_sweep_keeps_its_report(tmp_path):
    for name, lr in (("0", "0.1"), ("1", "0.2")):
        _job(tmp_path, name, [f"optim.lr={lr}"], [10.0 + float(lr)], sweeper=None)
    assert optuna_search([load_job(tmp_path / "0", tmp_path)]) is None
    files = write_report(tmp_path, plot=False)
    assert set(files) == set(REPORT_FILES) - {"png"}
    record = json.loads(files["json"].read_text())
    assert "search" not in record and "best" not in record
    assert [r["job"] for r in record["rows"]] == ["0", "1"]  # job order, not by BLEU
    assert "objective" not in record["rows"][0]
    md = files["markdown"].read_text()
    assert "Optuna" not in md and "best_overrides" not in md


def test_an_unreadable_hydra_yaml_is_named(tmp_path):
    _job(tmp_path, "0", ["optim.lr=0.2"], [1.0])
    bad = tmp_path / "0" / ".hydra" / "hydra.yaml"
    bad.write_text("hydra: [unclosed\n")
    with pytest.raises(DataError, match="hydra.yaml"):
        write_report(tmp_path, plot=False)
