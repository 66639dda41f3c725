"""The sweep report of an Optuna search (`python run.py -m hparams_search=...`).

An Optuna sweep leaves the same job folders as a grid, each one trial, and the sweeper's
settings in every job's `.hydra/hydra.yaml` (`hydra.sweeper`: direction, study, search space).
`optuna_search` recognises such a sweep; `rank_rows` orders the report's rows by the objective,
best first: each trial's best `optimized_metric`, what its run returned to the sweeper
(`summary.json`'s `best_value`); `best_trial` names the best one with its overrides, ready to
paste into a command, and `best_yaml` writes them as `best_trial.yaml`. Reading the study needs
no Optuna: everything comes from the job folders.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from convseq.errors import DataError
from convseq.evaluation.history import as_float, best_of

__all__ = [
    "BEST_FILE",
    "OptunaSearch",
    "best_trial",
    "best_yaml",
    "markdown_lines",
    "optuna_search",
    "rank_rows",
]

HYDRA_FILE = Path(".hydra") / "hydra.yaml"
BEST_FILE = "best_trial.yaml"  # written into the sweep folder beside sweep_report.*


class Job(Protocol):
    """What this module reads of a job (`convseq.evaluation.report.SweepJob`)."""

    name: str
    path: Path
    overrides: list[str]
    summary: dict[str, Any] | None
    history: list[dict[str, Any]]


@dataclass
class OptunaSearch:
    """An Optuna sweep's settings, as its jobs recorded them."""

    metric: str  # optimized_metric: the objective
    direction: str  # minimize | maximize
    study_name: str | None
    storage: str | None
    params: list[str]  # the searched keys (hydra.sweeper.params)

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"


def _load_yaml(path: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as e:  # a YAML syntax error: name the file
        raise DataError(f"unreadable YAML ({type(e).__name__}: {e})", path=str(path)) from e
    return value if isinstance(value, dict) else {}


def _metric(jobs: Sequence[Job]) -> str:
    """The optimized_metric the jobs' summaries name (valid/loss when none does)."""
    for job in jobs:
        metric = (job.summary or {}).get("optimized_metric")
        if metric:
            return str(metric)
    return "valid/loss"


def optuna_search(jobs: Sequence[Job]) -> OptunaSearch | None:
    """The Optuna search these jobs are trials of; None for a grid (or any other sweeper)."""
    for job in jobs:
        path = job.path / HYDRA_FILE
        if not path.is_file():
            continue
        sweeper = (_load_yaml(path).get("hydra") or {}).get("sweeper") or {}
        if "optuna" not in str(sweeper.get("_target_") or "").lower():
            return None
        direction = str(sweeper.get("direction") or "minimize").rsplit(".", 1)[-1].lower()
        return OptunaSearch(
            metric=_metric(jobs),
            direction=direction,
            study_name=sweeper.get("study_name"),
            storage=sweeper.get("storage"),
            params=[str(k) for k in (sweeper.get("params") or {})],
        )
    return None


def objective(job: Job, search: OptunaSearch) -> float:
    """The trial's objective: what its run returned (summary.json's best_value); NaN for a
    trial that failed, is still running or was cut short by a signal (none counts in the
    study: `convseq.cli.optuna_search`)."""
    summary = job.summary
    if not summary or summary.get("interrupted") or summary.get("signal"):
        return math.nan
    if summary.get("optimized_metric", search.metric) != search.metric:
        return best_of(list(summary.get("history") or []), search.metric, search.maximize)[0]
    return as_float(summary.get("best_value"))


def rank_rows(
    jobs: Sequence[Job], rows: Sequence[dict[str, Any]], search: OptunaSearch
) -> tuple[list[Job], list[dict[str, Any]]]:
    """Jobs and rows ordered best first by the objective (trials without one last, in job
    order); each row gains `objective` and `rank` (1 = best; None without an objective)."""
    values = [objective(j, search) for j in jobs]
    sign = -1.0 if search.maximize else 1.0

    def key(i: int) -> tuple[int, float, int]:
        v = values[i]
        return (0, sign * v, i) if math.isfinite(v) else (1, 0.0, i)

    order = sorted(range(len(jobs)), key=key)
    ranked = []
    for rank, i in enumerate(order, start=1):
        finite = math.isfinite(values[i])
        ranked.append({**rows[i], "objective": values[i], "rank": rank if finite else None})
    return [jobs[i] for i in order], ranked


def best_trial(
    jobs: Sequence[Job], rows: Sequence[dict[str, Any]], search: OptunaSearch
) -> dict[str, Any] | None:
    """The best trial of ranked `jobs`/`rows` (`rank_rows`): its job folder, objective, all its
    overrides (`python run.py OVERRIDES` runs it again), the searched values alone (`params`,
    for a full run with the chosen settings) and both as commands; None if no trial has a value.
    """
    if not rows or rows[0].get("rank") != 1:
        return None
    job = jobs[0]
    params = [o for o in job.overrides if o.split("=", 1)[0].lstrip("+~") in search.params]
    return {
        "job": job.name,
        "path": str(job.path),
        "optimized_metric": search.metric,
        "direction": search.direction,
        "value": rows[0]["objective"],
        "study_name": search.study_name,
        "overrides": list(job.overrides),
        "params": params,
        "command": _command(job.overrides),
        "params_command": _command(params),
    }


def _command(overrides: Sequence[str]) -> str:
    """`python run.py ...` with each override quoted for a POSIX shell where it needs it."""
    return " ".join(["python run.py", *(shlex.quote(o) for o in overrides)])


def markdown_lines(search: OptunaSearch, best: dict[str, Any] | None, trials: int) -> list[str]:
    """The report's paragraph on the search: the study, the objective and the best trial."""
    lines = [
        f"Optuna search `{search.study_name}`: {trials} trials, ordered by the objective "
        f"`{search.metric}` ({search.direction}), best first; job folder N is trial N.",
        "",
    ]
    if best is None:
        return lines + ["No trial has finished with a value yet.", ""]
    return lines + [
        f"Best trial: job {best['job']}, {search.metric} = {best['value']:.4f}.",
        "",
        f"best_overrides: `{' '.join(shlex.quote(o) for o in best['overrides'])}`",
        "",
        f"best_params: `{' '.join(shlex.quote(o) for o in best['params'])}`",
        "",
        f"Run the best trial again: `{best['command']}`; its settings in a full run: "
        f"`{best['params_command']}` (also in {BEST_FILE}).",
        "",
    ]


def best_yaml(best: dict[str, Any]) -> str:
    """best_trial.yaml: the best trial, its overrides as a list and as commands."""
    from omegaconf import OmegaConf

    head = (
        "# The best trial of the Optuna search in this folder (convseq's sweep report).\n"
        "# `command` runs it again; `params_command` trains with its searched settings only.\n"
    )
    return head + OmegaConf.to_yaml(OmegaConf.create(best))
