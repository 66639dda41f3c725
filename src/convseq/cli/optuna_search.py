"""Hyperparameter search with Optuna (`python run.py -m hparams_search=...`): what convseq adds
to hydra-optuna-sweeper.

The plugin alone starts `n_trials` new trials every time it runs and numbers their job folders
from 0 again, so a search run a second time with the same storage would run `n_trials` more
trials into folders that already hold runs. `ResumableOptunaSweeper`
(`hydra_plugins.convseq_optuna.resumable`) calls `resume_study` first:

- a trial the storage still lists as RUNNING was cut off with its process (a crash, a kill, a
  second Ctrl-C) and is marked FAIL, so that no sampler waits for it;
- `n_trials` is the number of finished trials the study should hold in all: only the missing
  ones run (none once the study is complete), a failed or cut-off trial being replaced by a new
  one;
- the new trials' job folders continue the numbering, so that job folder N is Optuna's trial N.

`check_search` refuses, before anything runs, a search whose direction does not match what
training returns (`convseq.tasks.train`: the best value of `optimized_metric`, the largest only
when that metric is `checkpoint.monitor` with `checkpoint.mode=max`), and one that cannot
start (the `sweep` extra missing). `cut_short` tells a trial that a signal ended early: the
search then stops with `SearchInterrupted`, and running the same command again continues it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from convseq.errors import ConvseqError
from convseq.evaluation.history import SUMMARY_FILE

__all__ = [
    "OPTUNA_SWEEPER",
    "SearchError",
    "SearchInterrupted",
    "StudyState",
    "check_search",
    "continue_sampler",
    "cut_short",
    "is_optuna_sweeper",
    "resume_study",
    "sqlite_path",
]

log = logging.getLogger(__name__)

# the sweeper class the hparams_search configs name (hydra.sweeper._target_)
OPTUNA_SWEEPER = "hydra_plugins.convseq_optuna.resumable.ResumableOptunaSweeper"
INSTALL = "pip install -e '.[sweep]'"


class SearchError(ConvseqError):
    """A hyperparameter search that cannot run as configured."""


class SearchInterrupted(ConvseqError):
    """A signal ended a trial early: the search stops; the same command continues it."""


def is_optuna_sweeper(sweeper: Mapping[str, Any] | None) -> bool:
    """Whether `hydra.sweeper` is an Optuna sweeper (convseq's or the plugin's own)."""
    target = str((sweeper or {}).get("_target_") or "")
    return "optuna" in target.lower()


def _direction_name(direction: Any) -> str:
    """'minimize' or 'maximize' from a string or the plugin's Direction enum."""
    name = getattr(direction, "name", direction)
    return str(name).rsplit(".", 1)[-1].lower()


def check_search(cfg: DictConfig) -> None:
    """Refuse an Optuna search that cannot start or would optimise the wrong way.

    Args:
        cfg: the composed config, `hydra` node included (what Hydra's callbacks receive).

    Raises:
        SearchError: the `sweep` extra is missing, there are several directions, or the
            direction disagrees with what training returns for `optimized_metric`.
    """
    # the Optuna plugin's own settings: its keys are the plugin's
    sweeper = OmegaConf.select(cfg, "hydra.sweeper", default=None) or {}
    for module in ("optuna", "hydra_plugins.hydra_optuna_sweeper"):
        if importlib.util.find_spec(module) is None:
            raise SearchError(
                f"hydra.sweeper is Optuna's, but {module} is not installed: run `{INSTALL}`"
            )
    direction = sweeper.get("direction")
    if not isinstance(direction, str) and hasattr(direction, "__len__"):
        raise SearchError(
            f"hydra.sweeper.direction={list(direction)}: training returns one value "
            "(optimized_metric); give one direction, minimize or maximize"
        )
    metric, ck = cfg.optimized_metric, cfg.checkpoint
    trains_max = metric == ck.monitor and ck.mode == "max"
    wanted = _direction_name(direction)
    if wanted == "maximize" and not trains_max:
        raise SearchError(
            f"hydra.sweeper.direction=maximize, but training returns the smallest "
            f"optimized_metric={metric} unless checkpoint.monitor={metric} and "
            "checkpoint.mode=max: set both for a metric where larger is better, or "
            "hydra.sweeper.direction=minimize for a loss"
        )
    if wanted == "minimize" and trains_max:
        raise SearchError(
            f"hydra.sweeper.direction=minimize, but optimized_metric={metric} is "
            "checkpoint.monitor with checkpoint.mode=max (training returns its largest value): "
            "set hydra.sweeper.direction=maximize"
        )


def sqlite_path(storage: Any) -> Path | None:
    """The database file of an `sqlite:///PATH` storage URL (None for other storages)."""
    text = str(storage or "")
    prefix = "sqlite:///"
    return Path(text[len(prefix) :]) if text.startswith(prefix) else None


@dataclass
class StudyState:
    """What a study held when the search started, and what this run does."""

    trials: int  # trials in the storage (every state): the next job folder's number
    done: int  # finished trials (complete or pruned): they count towards n_trials
    stale: int  # trials left RUNNING by a process that is gone, now marked failed
    to_run: int  # new trials this run starts


def resume_study(storage: Any, study_name: str | None, direction: Any, n_trials: int) -> StudyState:
    """Open (or create) the study and say how many trials are still to run.

    Call it before the sweeper starts: no trial of this study may be running elsewhere
    (one search process per storage).

    Args:
        storage: Optuna's storage URL (`sqlite:///...`); None keeps the study in memory.
        study_name: the study's name in the storage.
        direction: minimize or maximize.
        n_trials: the finished trials the study should hold in all.

    Raises:
        SearchError: a storage without a study name (a new random name each run could not
            be continued).
    """
    if storage is None:
        return StudyState(trials=0, done=0, stale=0, to_run=int(n_trials))
    if not study_name:
        raise SearchError(
            f"hydra.sweeper.storage={storage} needs hydra.sweeper.study_name=NAME: "
            "the search continues the study of that name"
        )
    import optuna
    from optuna.trial import TrialState

    db = sqlite_path(storage)
    if db is not None:  # the sweep folder does not exist before the first job
        db.parent.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(
        storage=storage,
        study_name=study_name,
        direction=_direction_name(direction),
        load_if_exists=True,
    )
    trials = study.get_trials(deepcopy=False)
    stale = [t for t in trials if t.state == TrialState.RUNNING]
    for trial in stale:
        study.tell(trial.number, state=TrialState.FAIL)
        log.warning("convseq: trial %d was cut off with its process: marked failed", trial.number)
    done = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    to_run = max(0, int(n_trials) - done)
    log.info(
        "convseq: study %s holds %d finished trials of %d: %d to run",
        study_name,
        done,
        n_trials,
        to_run,
    )
    return StudyState(trials=len(trials), done=done, stale=len(stale), to_run=to_run)


def continue_sampler(sampler: Any, trials: int) -> None:
    """Reseed `sampler` for a search that continues a study of `trials` trials.

    A seeded sampler built anew draws the same numbers as in the run before, so the trials a
    continued search asks for first would repeat the study's first trials (the random startup
    trials exactly). The new seed is drawn from the sampler's own seeded state and the number
    of trials: the same command continues the same way on every machine, and differently from
    the run before. Optuna 2's samplers keep their generator in `_rng` (TPE also in its random
    startup sampler); a sampler without one (a grid) is left alone.
    """
    import numpy as np

    rng = getattr(sampler, "_rng", None)
    if trials <= 0 or not isinstance(rng, np.random.RandomState):
        return
    base = int(rng.randint(2**31 - 1))  # the same for the same seed
    seed = int(np.random.SeedSequence([base, int(trials)]).generate_state(1)[0])
    sampler._rng = np.random.RandomState(seed)
    inner = getattr(sampler, "_random_sampler", None)
    if isinstance(getattr(inner, "_rng", None), np.random.RandomState):
        inner._rng = np.random.RandomState(seed + 1)


def cut_short(output_dir: str | Path) -> str | None:
    """The signal that ended the run in `output_dir` early (its summary.json), else None."""
    path = Path(output_dir) / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary.get("signal") or ("interrupted" if summary.get("interrupted") else None)
