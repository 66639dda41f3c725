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

A study remembers what it was run with: `resume_study` records the command's fixed settings
(`study_settings`: its overrides outside the search space and the sweep's own controls) in the
study's storage, as the study's user attribute `convseq_overrides`, and `check_study` refuses a
command that would continue the study with other settings (the trials would not be comparable).

`check_search` refuses, before anything runs, a search whose direction does not match what
training returns (`convseq.tasks.train`: the best value of `optimized_metric`, the largest only
when that metric is `checkpoint.monitor` with `checkpoint.mode=max`), one that cannot start
(the `sweep` extra missing) and one that would continue a study run with other fixed settings
(`check_study`). `cut_short` tells a trial that a signal ended early: the search then stops
with `SearchInterrupted`, and running the same command again continues it.
"""

from __future__ import annotations

import contextlib
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
    "SETTINGS_ATTR",
    "SWEEP_CONTROLS",
    "StudyState",
    "check_search",
    "check_study",
    "continue_sampler",
    "cut_short",
    "is_optuna_sweeper",
    "recorded_settings",
    "resume_study",
    "settings_difference",
    "sqlite_path",
    "study_settings",
]

log = logging.getLogger(__name__)

# the sweeper class the hparams_search configs name (hydra.sweeper._target_)
OPTUNA_SWEEPER = "hydra_plugins.convseq_optuna.resumable.ResumableOptunaSweeper"
INSTALL = "pip install -e '.[sweep]'"
# the study's user attribute that holds the fixed settings its trials ran with
SETTINGS_ATTR = "convseq_overrides"
# Overrides that leave a trial's result as it was (a key and the keys below it): how many
# trials run and how many at a time, how the sampler picks the next point, the search space,
# which study and folders, where the jobs run and what is logged. Every other override counts.
SWEEP_CONTROLS = (
    "hydra.sweeper.n_trials",
    "hydra.sweeper.n_jobs",
    "hydra.sweeper.max_failure_rate",
    "hydra.sweeper.sampler",
    "hydra.sweeper.params",
    "hydra.sweeper.study_name",
    "hydra.sweeper.storage",
    "hydra.sweep",
    "hydra.launcher",
    "hydra.mode",
    "hydra.verbose",
    "hydra.hydra_logging",
    "hydra.job_logging",
)


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
    """Refuse an Optuna search that cannot start, would optimise the wrong way or would mix
    the trials of other fixed settings into its study.

    Args:
        cfg: the composed config, `hydra` node included (what Hydra's callbacks receive).

    Raises:
        SearchError: the `sweep` extra is missing, there are several directions, the
            direction disagrees with what training returns for `optimized_metric`, or the
            study was run with other fixed settings (`check_study`).
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
    check_study(cfg)


def sqlite_path(storage: Any) -> Path | None:
    """The database file of an `sqlite:///PATH` storage URL (None for other storages)."""
    text = str(storage or "")
    prefix = "sqlite:///"
    return Path(text[len(prefix) :]) if text.startswith(prefix) else None


def _controls_the_sweep(key: str) -> bool:
    """Whether an override's key (`hydra/launcher`, `+hydra.verbose`...) is in SWEEP_CONTROLS."""
    name = key.lstrip("+~").split("@", 1)[0].replace("/", ".")
    return any(name == k or name.startswith(f"{k}.") for k in SWEEP_CONTROLS)


def study_settings(cfg: DictConfig) -> dict[str, str]:
    """The fixed settings a search's trials run with: `key -> value` of its command line's
    overrides (`hydra.overrides`, Hydra's own and the task's), less the search space (a key of
    `hydra.sweeper.params`, a sweep such as `interval(...)`) and SWEEP_CONTROLS. A value is
    written as Hydra's override parser reads it back (`optim.momentum=0.90` is `0.9`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = cfg.hydra.overrides
    swept = set(OmegaConf.select(cfg, "hydra.sweeper.params", default=None) or {})
    parsed = OverridesParser.create().parse_overrides([*overrides.hydra, *overrides.task])
    settings = {}
    for override in parsed:
        key = override.get_key_element()
        if override.is_sweep_override() or override.key_or_group in swept:
            continue
        if not _controls_the_sweep(key):
            settings[key] = override.get_value_element_as_str()
    return settings


def settings_difference(recorded: Mapping[str, str], current: Mapping[str, str]) -> str | None:
    """`was run with A=1 B=2; this command has A=3 B=(default)`, naming each key whose value
    differs (`(default)`: not given); None when both hold the same settings, in any order."""
    keys = sorted(k for k in {*recorded, *current} if recorded.get(k) != current.get(k))
    if not keys:
        return None

    def shown(settings: Mapping[str, str]) -> str:
        return " ".join(f"{k}={settings[k] if k in settings else '(default)'}" for k in keys)

    return f"was run with {shown(recorded)}; this command has {shown(current)}"


def _refuse_other_settings(
    study_name: str, recorded: Mapping[str, str], current: Mapping[str, str]
) -> None:
    difference = settings_difference(recorded, current)
    if difference is not None:
        raise SearchError(
            f"optuna study '{study_name}' {difference}: run it as a new study with "
            "hydra.sweeper.study_name=NEW, or repeat the first command's settings"
        )


def _sqlite_record(db: Path, study_name: str) -> Any:
    """The record in an SQLite storage, read with sqlite3 from Optuna's tables (`studies`,
    `study_user_attributes`), the file opened read-only: no Optuna to import for a refusal.

    Raises:
        sqlite3.Error: not a database of Optuna's tables as this reads them.
    """
    import sqlite3

    query = (
        "SELECT a.value_json FROM study_user_attributes AS a JOIN studies AS s "
        "ON a.study_id = s.study_id WHERE s.study_name = ? AND a.key = ?"
    )
    uri = f"{db.resolve().as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db_conn:
        row = db_conn.execute(query, (study_name, SETTINGS_ATTR)).fetchone()
    return json.loads(row[0]) if row else None


def _optuna_record(storage: Any, study_name: str) -> Any:
    """The record as Optuna reads it from any storage (None: no study of that name)."""
    import optuna

    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return None
    return study.user_attrs.get(SETTINGS_ATTR)


def recorded_settings(storage: Any, study_name: str | None) -> dict[str, str] | None:
    """The fixed settings recorded in an existing study (read only: a new SQLite file is not
    created); None without a storage, a study or a record (a study from before records)."""
    import sqlite3

    db = sqlite_path(storage)
    if storage is None or not study_name or (db is not None and not db.is_file()):
        return None
    try:
        if db is not None:
            record = _sqlite_record(db, study_name)
        else:
            record = _optuna_record(storage, study_name)
    except sqlite3.Error:  # tables laid out otherwise (another Optuna): Optuna reads them
        record = _optuna_record(storage, study_name)
    return dict(record) if isinstance(record, Mapping) else None


def check_study(cfg: DictConfig) -> None:
    """Refuse to continue a study with fixed settings other than those it was run with.

    Raises:
        SearchError: naming the settings that differ, and the two ways on.
    """
    sweeper = cfg.hydra.sweeper
    recorded = recorded_settings(sweeper.storage, sweeper.study_name)
    if recorded is not None:
        _refuse_other_settings(sweeper.study_name, recorded, study_settings(cfg))


@dataclass
class StudyState:
    """What a study held when the search started, and what this run does."""

    trials: int  # trials in the storage (every state): the next job folder's number
    done: int  # finished trials (complete or pruned): they count towards n_trials
    stale: int  # trials left RUNNING by a process that is gone, now marked failed
    to_run: int  # new trials this run starts


def _quiet_alembic() -> None:
    """alembic, under Optuna's SQLite storage, logs "setup plugin ..." at INFO, which Hydra's
    job logging prints: seven lines that tell a user nothing."""
    logging.getLogger("alembic").setLevel(logging.WARNING)


_quiet_alembic()  # as the sweeper loads this module, before Optuna opens a storage


def resume_study(
    storage: Any,
    study_name: str | None,
    direction: Any,
    n_trials: int,
    settings: Mapping[str, str] | None = None,
) -> StudyState:
    """Open (or create) the study and say how many trials are still to run.

    Call it before the sweeper starts: no trial of this study may be running elsewhere
    (one search process per storage).

    Args:
        storage: Optuna's storage URL (`sqlite:///...`); None keeps the study in memory.
        study_name: the study's name in the storage.
        direction: minimize or maximize.
        n_trials: the finished trials the study should hold in all.
        settings: this command's fixed settings (`study_settings`): recorded in a study that
            has no record yet, compared with the record of one that has.

    Raises:
        SearchError: a storage without a study name (a new random name each run could not
            be continued), or settings other than the study's record (nothing is changed).
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
    if settings is not None:
        _record_settings(study, study_name, settings, len(trials))
    stale = [t for t in trials if t.state == TrialState.RUNNING]
    for trial in stale:
        study.tell(trial.number, state=TrialState.FAIL)
        log.warning("convseq: trial %d was cut off with its process: marked failed", trial.number)
    done = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    to_run = max(0, int(n_trials) - done)
    log.info(
        "convseq: study %s holds %d finished trials of %d: %d to run",
        *(study_name, done, n_trials, to_run),
    )
    return StudyState(trials=len(trials), done=done, stale=len(stale), to_run=to_run)


def _record_settings(study: Any, study_name: str, settings: Mapping[str, str], trials: int) -> None:
    """Record `settings` in a study without a record; refuse other settings than its record."""
    recorded = study.user_attrs.get(SETTINGS_ATTR)
    if isinstance(recorded, Mapping):
        _refuse_other_settings(study_name, recorded, settings)
        return
    if trials:
        log.warning(
            "convseq: study %s holds %d trials from before studies recorded their settings: "
            "this command's settings are recorded as the study's",
            study_name,
            trials,
        )
    study.set_user_attr(SETTINGS_ATTR, dict(settings))


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
