"""The pieces a training run is made of: the module, the data module, the callbacks, the Trainer.

`convseq.tasks.train.train` puts them together (seeding, resuming, testing, the summary); each
is usable alone, e.g. to build a Trainer around a module in a notebook or a benchmark.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Timer

from convseq.checkpoints.io import BEST, CRASH, LAST, AtomicCheckpointIO
from convseq.common.config import plain
from convseq.data.databin import DataBin
from convseq.data.datamodule import TranslationDataModule
from convseq.errors import CheckpointError, ConvseqError
from convseq.models.family import model_config
from convseq.training.amp import precision_plugins
from convseq.training.bleu import TestBleu, ValidBleu, wants_valid_bleu
from convseq.training.callbacks import (
    AnnealingCallback,
    BatchEpochCallback,
    EpochCheckpoint,
    MaxUpdateCallback,
    RNGStateCallback,
)
from convseq.training.config import TrainConfig
from convseq.training.intervals import UpdateCheckpoint, validation_interval
from convseq.training.intervals import trainer_arguments as interval_arguments
from convseq.training.last_checkpoint import BestAndLast
from convseq.training.log_interval import LogIntervalClamp
from convseq.training.module import ConvSeqModule
from convseq.training.patience import Patience
from convseq.training.profiler import EpochProfiler, LoggingTimer
from convseq.training.progress import ProgressLines, progress_mode
from convseq.training.resume_agreement import ResumeAgreement
from convseq.training.signals import CrashCheckpoint, SignalCallback
from convseq.training.slurm import cluster_plugins, requeue_signal
from convseq.training.strategy import strategy_argument
from convseq.training.trackers import TrackerRunIds, build_loggers, config_callbacks

# TrainerConfig keys that are convseq's, or that build_trainer passes its own way
_NOT_TRAINER_ARGUMENTS = (
    "progress",
    "progress_seconds",
    "threads",
    "tf32",
    "max_epochs",
    "precision",
)

__all__ = [
    "build_callbacks",
    "build_datamodule",
    "build_module",
    "build_trainer",
    "check_resume",
    "hide_checkpoint_dir_warning",
    "stop_reason",
]


def build_module(cfg: TrainConfig, databin: DataBin) -> ConvSeqModule:
    """A freshly initialised ConvSeqModule for the data-bin's dictionaries."""
    return ConvSeqModule(
        model=cfg.model,
        src_vocab=databin.src_dict.to_list(),
        tgt_vocab=databin.tgt_dict.to_list(),
        optim=cfg.optim,
        criterion=cfg.criterion,
    )


def build_datamodule(
    cfg: TrainConfig, module: ConvSeqModule, databin: DataBin | None = None
) -> TranslationDataModule:
    """The data module, its length limits the tighter of the data's and the model's positions.

    Given the run's `databin` (already prepared), it prepares none itself.
    """
    src_pos, tgt_pos = module.model.max_positions()
    max_pos = cfg.data.max_positions
    return TranslationDataModule(
        cfg.data,
        cfg.batching,
        cfg.paths.cache_dir,
        seed=cfg.seed,
        max_source_positions=min(max_pos, src_pos),
        max_target_positions=min(max_pos, tgt_pos),
        databin=databin,
    )


def build_callbacks(
    cfg: TrainConfig, ckpt_dir: Path, resume: Path | None = None
) -> dict[str, pl.Callback]:
    """convseq's callbacks by name, in the order Lightning must call them.

    Lightning calls its checkpoint callbacks (`ModelCheckpoint`s) after all the others, in
    their order here; the others run in the order of this dict.

    Args:
        cfg: the run's config.
        ckpt_dir: the run's checkpoints folder.
        resume: the checkpoint this rank continues from (None: a new run); under DDP every
            rank must have chosen the same (`ResumeAgreement`).
    """
    monitor, mode = cfg.checkpoint.monitor, cfg.checkpoint.mode
    cbs = {**_state_callbacks(cfg, ckpt_dir), **_checkpoint_callbacks(cfg, ckpt_dir)}
    if cfg.patience > 0:
        cbs["patience"] = Patience(monitor=monitor, mode=mode, patience=cfg.patience, verbose=True)
    every = wants_valid_bleu(cfg)
    if every:
        cbs["valid_bleu"] = ValidBleu(every, cfg.gen)
    if cfg.final_test and cfg.gen.test_bleu:
        cbs["test_bleu"] = TestBleu(cfg.gen)
    if cfg.profile:
        cbs["profile"] = LoggingTimer()
    # per-update figures at least once an epoch, without Lightning's warning on small corpora
    cbs["log_interval"] = LogIntervalClamp()
    cbs["resume_agreement"] = ResumeAgreement(resume, cfg.resume)
    shown = progress_mode(cfg.trainer)
    if shown in ("lines", "json"):  # the job log: a line per interval, validation, checkpoint, stop
        max_epochs = cfg.trainer.max_epochs
        cbs["progress"] = ProgressLines(
            shown,
            stop_reason=lambda trainer: stop_reason(trainer, cbs, max_epochs),
            monitor=(monitor, mode),
            patience=cbs.get("patience"),
            every_seconds=cfg.trainer.progress_seconds,
        )
    # the trackers' config and run ids (kept in the checkpoint for a resumed run)
    cbs["trackers"] = TrackerRunIds(cfg, ckpt_dir.parent, resumed=resume is not None)
    for key, callback in config_callbacks(cfg.callbacks):  # the user's own, from `callbacks`
        cbs[key] = callback
    return cbs


def _state_callbacks(cfg: TrainConfig, ckpt_dir: Path) -> dict[str, pl.Callback]:
    """What a resumed run continues from (batch position, lr, RNG) and what stops a run."""
    max_update = cfg.max_update
    return {
        # First: advances the batch sampler's position before the signal handler saves it.
        "batches": BatchEpochCallback(),
        "anneal": AnnealingCallback(
            cfg.anneal,
            lr=cfg.optim.lr,
            by_validation=validation_interval(cfg) > 0,
            max_update=max_update,
        ),
        "max_update": MaxUpdateCallback(max_update),
        "rng": RNGStateCallback(),
        # SIGUSR1 too under SLURM: saved and requeued by convseq, not Lightning (training/slurm.py)
        "signal": SignalCallback(str(ckpt_dir / LAST), requeue_signal()),
        "crash": CrashCheckpoint(str(ckpt_dir / CRASH)),
    }


def _checkpoint_callbacks(cfg: TrainConfig, ckpt_dir: Path) -> dict[str, pl.Callback]:
    """best.ckpt and last.ckpt, and the update and epoch checkpoints `checkpoint.*` asks for."""
    ck = cfg.checkpoint
    by_updates = validation_interval(cfg) > 0
    cbs: dict[str, pl.Callback] = {
        "best": BestAndLast(
            dirpath=str(ckpt_dir),
            filename=Path(BEST).stem,
            monitor=ck.monitor,
            mode=ck.mode,
            save_top_k=1,
            save_last=ck.save_last,
            auto_insert_metric_name=False,
            # At the very end of the epoch (after validation, annealing and the epoch's logs),
            # where Lightning resumes cleanly at the next epoch; with validations by updates,
            # right after each validation (and its annealing step) instead.
            save_on_train_epoch_end=not by_updates,
            enable_version_counter=False,
        ),
    }
    if by_updates:  # last.ckpt at the end of every epoch too, as fairseq's checkpoint_last.pt
        cbs["last"] = BestAndLast(
            dirpath=str(ckpt_dir),
            save_top_k=0,
            save_last=True,
            save_on_train_epoch_end=True,
            enable_version_counter=False,
        )
    if cfg.save_interval_updates:
        cbs["updates"] = UpdateCheckpoint(
            ckpt_dir, cfg.save_interval_updates, ck.keep_interval_updates
        )
    if ck.keep_epochs != 0:
        cbs["epochs"] = EpochCheckpoint(str(ckpt_dir), ck.keep_epochs)
    return cbs


def build_trainer(
    cfg: TrainConfig,
    callbacks: list[pl.Callback],
    output_dir: Path,
    tracker_state: Mapping[str, Any] | None = None,
) -> pl.Trainer:
    """The Trainer of `cfg.trainer`, with convseq's fixed choices.

    Its loggers: csv/metrics.csv and the trackers of `cfg.logger`, which continue the runs
    of `tracker_state` (`convseq.training.trackers.tracker_resume` of the checkpoint resumed).
    """
    # the Trainer's own arguments; convseq's keys (progress, threads: set before the Trainer
    # is made, tf32: set by dispatch) are not Trainer arguments, and the bar shows only with
    # progress=bar (or auto on a terminal)
    kwargs = {
        k: v
        for k, v in plain(cfg.trainer).items()
        if v is not None and k not in _NOT_TRAINER_ARGUMENTS
    }
    kwargs["enable_progress_bar"] = progress_mode(cfg.trainer) == "bar"
    max_epochs = cfg.trainer.max_epochs
    kwargs.update(interval_arguments(cfg))  # validate_interval_updates / save_interval_updates
    kwargs["strategy"] = strategy_argument(cfg.trainer.strategy)  # ddp: no per-batch broadcast
    # 16-mixed: fairseq's loss scaling, as a plugin
    precision, precision_plugins_ = precision_plugins(cfg.trainer, cfg.amp)
    if precision is not None:
        kwargs["precision"] = precision
    loggers = build_loggers(cfg.logger, output_dir, tracker_state)
    clip = cfg.optim.clip_norm
    hide_checkpoint_dir_warning()  # a resumed run's own folder
    return pl.Trainer(
        **kwargs,
        max_epochs=max_epochs if max_epochs > 0 else -1,  # fairseq: 0 = no limit
        gradient_clip_val=clip if clip > 0 else None,
        gradient_clip_algorithm="norm",
        use_distributed_sampler=False,  # the batch sampler shards by rank itself
        default_root_dir=str(output_dir),
        callbacks=callbacks,
        logger=loggers,
        plugins=[AtomicCheckpointIO(), *precision_plugins_, *cluster_plugins()],
        enable_model_summary=False,
        profiler=EpochProfiler() if cfg.profile else None,
    )


def hide_checkpoint_dir_warning() -> None:
    """Filter Lightning's "Checkpoint directory <dir> exists and is not empty." (idempotent).

    Its ModelCheckpoint says so whenever the folder holds a file; convseq refuses a new run in a
    folder that holds a run, so the folder is the resumed run's own and the line tells a user
    nothing. Only that warning, only from Lightning's ModelCheckpoint: its other warnings, and
    the same words from elsewhere, still show.
    """
    warnings.filterwarnings(
        "ignore",
        message=r"Checkpoint directory .* exists and is not empty",
        module=r"pytorch_lightning\.callbacks\.model_checkpoint",
    )


def check_resume(
    ckpt: Mapping[str, Any], module: ConvSeqModule, path: Path, databin: DataBin
) -> int:
    """Refuse a checkpoint of another model or vocabulary; return its logging step."""
    hp = ckpt.get("hyper_parameters")
    if not isinstance(hp, Mapping) or "model" not in hp or "tgt_vocab" not in hp:
        raise CheckpointError(
            f"{path}: not a convseq training checkpoint (no model hyperparameters)"
        )
    mine = module.hparams
    try:  # typed, so that a key the checkpoint predates compares as its default
        theirs_model = plain(model_config(hp["model"]))
    except ConvseqError as e:
        raise CheckpointError(f"{path}: its model configuration does not read: {e}") from e
    ours_model = plain(module.model_cfg)
    # one family's configs have the same keys; another family's differ in `family` first
    same_family = theirs_model["family"] == ours_model["family"]
    keys = sorted(ours_model) if same_family else ["family"]
    changed = [k for k in keys if theirs_model[k] != ours_model[k]]
    if changed:
        detail = ", ".join(
            f"{k}: {theirs_model[k]!r} there, {ours_model[k]!r} now" for k in changed
        )
        raise CheckpointError(
            f"{path}: trained with another model configuration ({detail}); resume with the "
            "same model settings"
        )
    for side, lang in (("src_vocab", databin.src_lang), ("tgt_vocab", databin.tgt_lang)):
        theirs, ours = list(hp[side]), list(mine[side])
        if theirs != ours:
            dict_file = databin.path / f"dict.{lang}.txt"
            if len(theirs) != len(ours):
                how = f"{len(theirs)} symbols there, {len(ours)} in {dict_file}"
            else:
                i = next(i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b)
                how = (
                    f"both {len(ours)} symbols, but symbol {i} is {theirs[i]!r} there and "
                    f"{ours[i]!r} in {dict_file}"
                )
            raise CheckpointError(
                f"{path}: its {side} does not match this run's data-bin ({how}); resume with "
                "the data (data=..., data.* settings) the run was trained on"
            )
    try:
        return int(ckpt["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"])
    except (KeyError, TypeError):
        return -1


def stop_reason(
    trainer: pl.Trainer,
    cbs: Mapping[str, pl.Callback],
    max_epochs: int,
    include_signal: bool = True,
) -> str:
    """Why training stopped, as summary.json's `stop_reason` says it.

    With ``include_signal=False``, the rule or limit that stopped it besides a signal
    ("finished" when none did): a signal during the last epoch of a run at its limit leaves the
    run finished.
    """
    for name in ("signal", "anneal", "max_update") if include_signal else ("anneal", "max_update"):
        reason = getattr(cbs[name], "stop_reason", None)
        if reason:
            return reason
    es = cbs.get("patience")
    if isinstance(es, Patience) and es.stopped_epoch > 0:
        return f"no improvement of {es.monitor} in {es.patience} validations (patience)"
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    if timer is not None and (timer.time_remaining() or 0) <= 0:
        return "reached trainer.max_time"
    if trainer.fast_dev_run:
        return "fast_dev_run"
    if max_epochs > 0 and trainer.current_epoch >= max_epochs:
        return f"reached trainer.max_epochs={max_epochs}"
    return "finished"
