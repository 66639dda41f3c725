"""Experiment trackers and extra callbacks, built from the config's `_target_` entries.

`logger` (conf/logger/) is either one entry (`_target_` plus its arguments: `logger=mlflow
logger.tracking_uri=...`) or a dict of named entries (`logger=many`: `logger.mlflow.*`); each
is a Lightning logger made by `hydra.utils.instantiate`, so a YAML file under conf/logger/ adds
a user's own. `callbacks` (conf/callbacks/) holds named entries the same way, for extra
Lightning callbacks.

Whatever is chosen, convseq's own `csv/metrics.csv` (`AppendingCSVLogger`) is written: its
reports and the run's summary read it. The trackers get what the CSV gets (every logged figure
at its step), and besides, through `TrackerRunIds`: the composed config as hyperparameters
(flattened to dotted keys, nested for W&B, which shows a tree) and the run folder's path.

Resuming continues the same tracker run: `TrackerRunIds` stores the MLflow and W&B run ids in
the checkpoint, and `tracker_resume` reads them back; TensorBoard opens its folder again with
`purge_step` one past the checkpoint's step, so that anything a killed process logged after
its last checkpoint is dropped by TensorBoard's readers, as metrics.csv drops those rows.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from pytorch_lightning.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from pytorch_lightning.utilities import rank_zero_only

from convseq.common.config import plain
from convseq.errors import ConvseqError
from convseq.training.config import TrainConfig
from convseq.training.run_log import AppendingCSVLogger

__all__ = [
    "INSTALL_LOGGERS",
    "TrackerError",
    "TrackerRunIds",
    "build_loggers",
    "close_trackers",
    "config_callbacks",
    "flatten_config",
    "log_test_scores",
    "tracker_resume",
]

INSTALL_LOGGERS = 'pip install -e ".[loggers]"'
# Lightning's logger classes whose package is optional: any one of the modules will do.
PACKAGES: dict[type, tuple[str, ...]] = {
    TensorBoardLogger: ("tensorboard", "tensorboardX"),
    MLFlowLogger: ("mlflow",),
    WandbLogger: ("wandb",),
}
TEST_SCORES = ("test/bleu", "test/chrf")  # test figures scored after trainer.test
STATE_KEY = "TrackerRunIds"  # the checkpoint's callbacks[...] entry holding the run ids


class TrackerError(ConvseqError):
    """A `logger` or `callbacks` entry cannot be built (missing package, bad target or arguments)."""


def target_entries(node: Any, key: str) -> list[tuple[str, dict[str, Any]]]:
    """The `_target_` entries of a `logger` or `callbacks` node, as (dotted key, entry).

    The node itself when it has a `_target_`, else each of its values (a null value is left
    out, so `logger.mlflow=null` drops one of `logger=many`'s trackers).

    Raises:
        TrackerError: a value that is neither null nor a `_target_` entry, named by its key.
    """
    if node is None:
        return []
    if not isinstance(node, Mapping):
        raise TrackerError(f"{key}: expected a `_target_` entry or a dict of them, got {node!r}")
    if "_target_" in node:
        return [(key, dict(node))]
    entries = []
    for name, entry in node.items():
        if entry is None:
            continue
        if not isinstance(entry, Mapping) or "_target_" not in entry:
            raise TrackerError(
                f"{key}.{name}: not a `_target_` entry ({entry!r}); give it a `_target_: "
                "module.Class` and the class's arguments, or null to leave it out"
            )
        entries.append((f"{key}.{name}", dict(entry)))
    return entries


def _target_class(key: str, entry: Mapping[str, Any]) -> type:
    """The class an entry names, its optional package checked first.

    Raises:
        TrackerError: the class cannot be imported, or a tracker's package is missing (with the
            `pip install` line that adds it).
    """
    target = str(entry["_target_"])
    try:
        cls = get_class(target)
    except (ImportError, ValueError) as e:
        raise TrackerError(f"{key}._target_: cannot import {target!r} ({e})") from e
    for base, modules in PACKAGES.items():
        if issubclass(cls, base) and not any(importlib.util.find_spec(m) for m in modules):
            raise TrackerError(
                f"{key}: {cls.__name__} needs the {modules[0]!r} package, which is not "
                f"installed; run: {INSTALL_LOGGERS}"
            )
    return cls


def _build(key: str, entry: Mapping[str, Any], extra: Mapping[str, Any]) -> Any:
    """`instantiate(entry, **extra)`, its failures named by key."""
    try:
        return instantiate(dict(entry), **extra)
    except InstantiationException as e:
        raise TrackerError(f"{key}: cannot build {entry['_target_']!r}: {e}") from e
    except ModuleNotFoundError as e:  # a package the class imports when it is built
        raise TrackerError(
            f"{key}: {entry['_target_']!r} needs {e.name!r}; run: {INSTALL_LOGGERS}"
        ) from e


def tracker_resume(ckpt: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a resumed run's trackers continue from: the checkpoint's logging step and the run
    ids `TrackerRunIds` stored in it ({} for a new run)."""
    if not ckpt:
        return {}
    try:
        step = int(ckpt["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"])
    except (KeyError, TypeError):
        step = -1
    ids = (ckpt.get("callbacks") or {}).get(STATE_KEY) or {}
    return {"step": step, "run_ids": dict(ids)}


def _resume_arguments(cls: type, entry: Mapping[str, Any], resume: Mapping[str, Any]) -> dict:
    """The arguments that make a tracker continue its run, unless the entry sets them."""
    ids, step = resume.get("run_ids") or {}, int(resume.get("step", -1))
    extra: dict[str, Any] = {}
    if issubclass(cls, TensorBoardLogger) and step >= 0 and "purge_step" not in entry:
        extra["purge_step"] = step + 1  # readers drop events after the checkpoint
    if issubclass(cls, MLFlowLogger) and ids.get("MLFlowLogger") and not entry.get("run_id"):
        extra["run_id"] = ids["MLFlowLogger"]
    if issubclass(cls, WandbLogger) and ids.get("WandbLogger") and not entry.get("id"):
        extra["id"] = ids["WandbLogger"]
        extra["resume"] = entry.get("resume") or "allow"
    return extra


def _allow_file_store(entry: Mapping[str, Any]) -> None:
    """MLflow 3 refuses a file store unless MLFLOW_ALLOW_FILE_STORE is set; convseq's default is
    one (`<run dir>/mlruns`: no server, nothing to install), so it is allowed when chosen."""
    uri = str(entry.get("tracking_uri") or "")
    if "://" not in uri or uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def build_loggers(
    logger: Any, output_dir: Path, resume: Mapping[str, Any] | None = None
) -> list[Logger]:
    """convseq's CSV logger first, then the trackers of the `logger` config (one `_target_`
    entry, or a dict of them).

    Args:
        logger: the run's `logger` config (an open node: the trackers' own arguments).
        output_dir: the run folder (csv/metrics.csv goes there whatever `logger` says).
        resume: `tracker_resume(checkpoint)` when continuing a run.
    """
    csv_dir = (Path(output_dir) / "csv").absolute()
    loggers: list[Logger] = []
    for key, entry in target_entries(logger, "logger"):
        cls = _target_class(key, entry)
        if issubclass(cls, MLFlowLogger):
            _allow_file_store(entry)
        loggers.append(_build(key, entry, _resume_arguments(cls, entry, resume or {})))
    own = [
        lg
        for lg in loggers
        if isinstance(lg, AppendingCSVLogger) and Path(lg.log_dir).absolute() == csv_dir
    ]
    rest = [lg for lg in loggers if lg not in own]
    return [*(own[:1] or [AppendingCSVLogger(str(output_dir))]), *rest]


def config_callbacks(callbacks: Any) -> list[tuple[str, pl.Callback]]:
    """The extra Lightning callbacks of the `callbacks` config (a dict of `_target_` entries),
    in the order given, by dotted key.

    Raises:
        TrackerError: an entry that cannot be built or is not a Lightning callback.
    """
    made = []
    for key, entry in target_entries(callbacks, "callbacks"):
        cls = _target_class(key, entry)
        if not issubclass(cls, pl.Callback):
            raise TrackerError(
                f"{key}: {entry['_target_']!r} is not a Lightning callback "
                "(pytorch_lightning.Callback)"
            )
        made.append((key, _build(key, entry, {})))
    return made


def flatten_config(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`cfg` as one level of dotted keys (the command line's spelling: `optim.lr`); lists and
    None as text, which every tracker takes."""
    flat: dict[str, Any] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def _trackers(trainer: pl.Trainer) -> list[Logger]:
    """The trainer's loggers other than convseq's CSV one."""
    return [lg for lg in trainer.loggers if not isinstance(lg, AppendingCSVLogger)]


def _log_mlflow_params(logger: MLFlowLogger, flat: Mapping[str, Any]) -> None:
    """MLflow never changes a logged parameter: a resumed run logs the new keys, and a value
    the command line changed (trainer.max_epochs=...) as a tag `resumed.<key>`."""
    old = logger.experiment.get_run(logger.run_id).data.params
    new = {k: v for k, v in flat.items() if k not in old}
    if new:
        logger.log_hyperparams(new)
    for k, v in flat.items():
        if k in old and old[k] != str(v)[: len(old[k])]:
            logger.experiment.set_tag(logger.run_id, f"resumed.{k}", str(v))


def _tensorboard_hparams(logger: TensorBoardLogger, flat: Mapping[str, Any], shown: list) -> None:
    """The config in TensorBoard's HPARAMS tab, its columns the figures `shown` (their values
    are the scalars logged under those names; none is logged here, unlike Lightning's
    `log_hyperparams(params, metrics)`, which would add a value at step 0)."""
    if importlib.util.find_spec("tensorboard"):  # what Lightning's writer is, then
        from torch.utils.tensorboard.summary import hparams
    else:
        from tensorboardX.summary import hparams
    writer = logger.experiment._get_file_writer()
    for summary in hparams(dict(flat), dict.fromkeys(shown, 0.0)):
        writer.add_summary(summary)


class TrackerRunIds(pl.Callback):
    """Gives the trackers the config and the run folder at the start of fitting, and keeps their
    run ids in the checkpoint so that a resumed run continues the same tracker runs."""

    def __init__(self, cfg: TrainConfig, output_dir: Path, resumed: bool = False):
        self.cfg, self.output_dir, self.resumed = cfg, str(output_dir), resumed

    @property
    def state_key(self) -> str:
        return STATE_KEY

    @rank_zero_only
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        nested = {**plain(self.cfg), "run_dir": self.output_dir}
        flat = flatten_config(nested)
        for logger in _trackers(trainer):
            if isinstance(logger, WandbLogger):
                logger.log_hyperparams(nested)  # W&B shows a nested config as a tree
            elif isinstance(logger, MLFlowLogger) and self.resumed:
                _log_mlflow_params(logger, flat)
            else:
                logger.log_hyperparams(flat)  # TensorBoard: its hparams.yaml
            if isinstance(logger, TensorBoardLogger):
                _tensorboard_hparams(logger, flat, self._shown())
            if isinstance(logger, MLFlowLogger):
                logger.experiment.set_tag(logger.run_id, "run_dir", self.output_dir)

    def _shown(self) -> list[str]:
        """The figures a tracker's table of runs shows beside the config."""
        cfg = self.cfg
        names = [cfg.optimized_metric, cfg.checkpoint.monitor, "valid/loss", "test/loss"]
        names += ["test/bleu"] if cfg.gen.test_bleu else []
        return list(dict.fromkeys(n for n in names if n))

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        """The stored ids, updated with the live trackers' (a tracker not chosen this time
        keeps its id for a later resume that chooses it again)."""
        trainer = getattr(self, "_trainer", None)
        live = self._collect(trainer) if trainer is not None else {}
        return {**getattr(self, "_ids", {}), **{k: v for k, v in live.items() if v}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._ids = dict(state_dict)

    def _collect(self, trainer: pl.Trainer) -> dict[str, Any]:
        """The run id of each MLflow and W&B tracker (rank 0's; None elsewhere)."""
        ids: dict[str, Any] = {}
        for logger in _trackers(trainer):
            if isinstance(logger, MLFlowLogger):
                ids["MLFlowLogger"] = logger.run_id
            elif isinstance(logger, WandbLogger):
                ids["WandbLogger"] = logger.version
        return ids


@rank_zero_only
def log_test_scores(trainer: pl.Trainer, figures: Mapping[str, Any], step: int) -> None:
    """Log the test BLEU and chrF of `figures` at `step` to the trackers only: they are
    scored after `trainer.test` (which logged the test loss), and summary.json holds them for
    convseq's own reports."""
    numbers = {
        k: float(figures[k]) for k in TEST_SCORES if isinstance(figures.get(k), (int, float))
    }
    if not numbers:
        return
    for logger in _trackers(trainer):
        logger.log_metrics(numbers, step=step)
        logger.save()


@rank_zero_only
def close_trackers(trainer: pl.Trainer, interrupted: bool = False) -> None:
    """End the W&B run (its files are complete, and a next run in this process starts its own);
    Lightning has already finalised the others."""
    for logger in _trackers(trainer):
        if isinstance(logger, WandbLogger) and getattr(logger, "_experiment", None) is not None:
            logger.experiment.finish(exit_code=75 if interrupted else 0)
