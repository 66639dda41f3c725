"""A training run from its fit to its summary: fitting, the final test with the best
checkpoint, and what summary.json holds.

`convseq.tasks.train` opens the run folder, prepares the data-bin and builds the parts (`Run`);
this module fits them (`fit`), tests the best checkpoint (`final_test`) and writes nothing but
returns the figures (`summary`, `add_profile`, `extra_test_sets`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from convseq.checkpoints.io import CHECKPOINT_DIR, LAST
from convseq.data.datamodule import TranslationDataModule
from convseq.evaluation.history import best_of, minutes_to_scores
from convseq.inference.records import write_hypotheses
from convseq.training.bleu import TestBleu
from convseq.training.build import stop_reason
from convseq.training.config import TrainConfig
from convseq.training.interruption import (
    CONTINUE_WITH,
    EpochsDone,
    epochs_done,
    exit_status,
    last_epoch_complete,
    last_validation,
    signal_name,
    stop_point,
)
from convseq.training.intervals import validation_interval
from convseq.training.module import ConvSeqModule
from convseq.training.profiler import EpochProfiler
from convseq.training.signals import TrainingInterrupted

__all__ = ["Fit", "Run", "add_profile", "extra_test_sets", "final_test", "fit", "summary"]


@dataclass
class Run:
    """One training run's parts, as `_build_run` puts them together."""

    cfg: TrainConfig
    output_dir: Path
    resume: Path | None  # the checkpoint the run continues from
    module: ConvSeqModule
    datamodule: TranslationDataModule
    callbacks: dict[str, pl.Callback]  # convseq's own, by role ("best", "test_bleu", ...)
    trainer: pl.Trainer

    @property
    def ckpt_dir(self) -> Path:
        return self.output_dir / CHECKPOINT_DIR


@dataclass
class Fit:
    """What fitting left, taken before testing: loading best.ckpt for the test restores that
    epoch's module and callback states."""

    interrupted: bool  # stopped by SIGTERM/SIGINT in the middle of an epoch (TrainingInterrupted)
    signal: str | None  # the signal that cut the run short (None: it finished by its limits)
    stopped_at: dict[str, Any]  # epoch, updates in it and in all (`stop_point`)
    history: list[dict[str, Any]]  # per epoch
    seconds: float  # training time
    best_path: str  # best.ckpt, or "" when none was saved
    reason: str  # the stop reason
    # Lightning's epoch count: a last epoch a limit stopped partway counts as one, one a
    # signal cut short does not (`done` counts both honestly)
    epochs: int
    updates: int  # fp16 updates the loss scaler skipped are not counted
    validations: list[dict[str, Any]]  # every validation (minutes included)
    done: EpochsDone  # the epochs trained to their end and the updates of a partial last one


def fit(run: Run) -> Fit:
    """Fit (from ``run.resume`` if set) and take the run's figures before anything is tested."""
    module, trainer, resume = run.module, run.trainer, run.resume
    interrupted = False
    try:
        trainer.fit(module, datamodule=run.datamodule, ckpt_path=str(resume) if resume else None)
    except TrainingInterrupted:
        interrupted = True

    # Taken before testing: loading best.ckpt for the test restores that epoch's module and
    # callback states.
    history = [dict(h) for h in module.history]
    validations = [dict(v) for v in module.validations]
    seconds = module.training_seconds()
    best_path = getattr(run.callbacks["best"], "best_model_path", "") or ""
    max_epochs = run.cfg.trainer.max_epochs
    reason = stop_reason(trainer, run.callbacks, max_epochs)
    # a signal cuts the run short unless it came in the epoch where a rule or limit ended it
    limit = stop_reason(trainer, run.callbacks, max_epochs, include_signal=False)
    received = getattr(run.callbacks["signal"], "stop_reason", None)
    cut = interrupted or (received is not None and limit == "finished")
    sig = signal_name(getattr(run.callbacks["signal"], "received", None)) if cut else None
    if received is not None and not cut:
        reason = limit
    epochs = trainer.current_epoch if not interrupted else len(history)
    updates = module.updates  # fp16 updates the loss scaler skipped are not counted
    at = stop_point(trainer, history, updates, mid_epoch=interrupted)
    done = epochs_done(at, complete=interrupted or last_epoch_complete(trainer))
    return Fit(
        interrupted,
        sig,
        at,
        history,
        seconds,
        best_path,
        reason,
        epochs,
        updates,
        validations,
        done,
    )


def final_test(run: Run, fit: Fit) -> tuple[Path | None, dict[str, dict]]:
    """Evaluate the test split with the best checkpoint, unless interrupted or ``final_test``
    is off, or a signal cut the run short (the run that finishes it tests); with `TestBleu`, write (rank 0) and score its translations and the extra test sets'.

    Returns:
        generate-test.txt (None when nothing was translated) and the extra test sets' figures.
    """
    module, trainer = run.module, run.trainer
    # final_test=false: a tuning run never evaluates on test
    evaluate = run.cfg.final_test and fit.signal is None
    if evaluate:
        # a fast_dev_run tests the weights in memory, other runs best.ckpt's
        ckpt_path = None if trainer.fast_dev_run else (fit.best_path or None)
        trainer.test(module, datamodule=run.datamodule, ckpt_path=ckpt_path, verbose=False)
    test_hypotheses: Path | None = None
    test_sets: dict[str, dict] = {}
    test_bleu = run.callbacks.get("test_bleu")
    if evaluate and isinstance(test_bleu, TestBleu) and test_bleu.scores is not None:
        # translated inside trainer.test, on the training device(s), with best.ckpt's weights
        scores = test_bleu.scores
        module.test_figures.update({"test/bleu": scores.bleu, "test/chrf": scores.chrf})
        module.test_figures["test/bleu_signature"] = scores.bleu_signature
        test_hypotheses = run.output_dir / "generate-test.txt"
        if trainer.is_global_zero:
            write_hypotheses(test_hypotheses, test_bleu.hypotheses)
            for line in scores.lines():
                print(f"convseq: test {line}", flush=True)
        test_sets = extra_test_sets(test_bleu, run.output_dir, trainer.is_global_zero)
    return test_hypotheses, test_sets


def summary(
    run: Run,
    fit: Fit,
    test_hypotheses: Path | None,
    test_sets: dict[str, dict],
    t_start: float,
) -> dict[str, Any]:
    """summary.json's content (see the module docstring), with the best `optimized_metric`."""
    cfg, module, ckpt_dir = run.cfg, run.module, run.ckpt_dir
    metric = cfg.optimized_metric
    maximize = metric == cfg.checkpoint.monitor and cfg.checkpoint.mode == "max"
    validations = fit.validations  # the module now holds best.ckpt's, up to the best epoch
    by_updates = validation_interval(cfg) > 0
    best_value, best_epoch = best_of(validations if by_updates else fit.history, metric, maximize)
    test_bleu = run.callbacks.get("test_bleu")
    trained = fit.done.trained
    return {
        # Lightning's epoch count, as before: a last epoch that max_update, max_time or a rule
        # stopped partway counts as one (one a signal cut short does not)
        "epochs": fit.epochs,
        "epochs_completed": fit.done.completed,  # epochs trained to their end
        # a partial last epoch as its fraction of updates: 1 epoch and 37 of 250 updates, 1.148
        # (null when that epoch's length is unknown)
        "epochs_trained": trained,
        "updates": fit.updates,
        "skipped_updates": module.skipped_updates,
        "train_seconds": fit.seconds,
        # over epochs_trained (null before any update, or when it is unknown)
        "seconds_per_epoch": fit.seconds / trained if trained else None,
        "process_seconds": time.perf_counter() - t_start,
        "stop_reason": fit.reason,
        "interrupted": fit.interrupted,
        # the signal that cut the run short (then `python run.py` exits with 75), else null
        "signal": fit.signal,
        "exit_status": exit_status({"signal": fit.signal}),
        # epoch (1-based), its updates done and in all, the run's updates, mid_epoch
        "stopped_at": fit.stopped_at,
        "last_validation": last_validation(validations),
        "continue_with": CONTINUE_WITH if fit.signal else None,
        "optimized_metric": metric,
        "best_value": best_value,
        "best_epoch": best_epoch,
        "best_checkpoint": fit.best_path or None,
        "last_checkpoint": str(ckpt_dir / LAST) if (ckpt_dir / LAST).exists() else None,
        "resumed_from": str(run.resume) if run.resume else None,
        "test": dict(module.test_figures),
        "test_hypotheses": str(test_hypotheses) if test_hypotheses else None,
        # data.test_sets: name -> sentences, bleu, chrf, signatures, hypotheses file
        "test_sets": test_sets,
        # where the end-of-training translation ran (the training device), e.g. "cuda:0"
        "test_device": test_bleu.device if isinstance(test_bleu, TestBleu) else None,
        "history": fit.history,
        # every validation with its epoch and update count (inside epochs with
        # validate_interval_updates) and the command's minutes when it ended
        "validations": validations,
        # whole number n -> minutes since the command started when valid BLEU first reached n
        "minutes_to_valid_bleu": {str(n): m for n, m in minutes_to_scores(validations).items()},
    }


def add_profile(trainer: pl.Trainer, summary: dict[str, Any]) -> None:
    """With `profile=true` (an `EpochProfiler`): the mean epoch breakdown into ``summary``,
    and its table printed (rank 0)."""
    if isinstance(trainer.profiler, EpochProfiler):
        profiler = trainer.profiler
        summary["profile"] = {
            "epochs": profiler.epochs,
            "mean": profiler.mean(),
            "top_actions": profiler.top_actions(),
        }
        if trainer.is_global_zero:
            print(trainer.profiler.table(), flush=True)


def extra_test_sets(test_bleu: TestBleu, output_dir: Path, write: bool) -> dict[str, dict]:
    """The extra test sets' figures for summary.json; with `write` (rank 0), each set's
    hypotheses go to generate-<name>.txt and its scores are printed, one line a set."""
    figures = {}
    for name, (scores, hyps) in test_bleu.extra.items():
        path = output_dir / f"generate-{name}.txt"
        if write:
            write_hypotheses(path, hyps)
            print(
                f"convseq: test set {name} ({len(hyps)} sentences): BLEU {scores.bleu:.2f}, "
                f"chrF {scores.chrf:.2f}",
                flush=True,
            )
        figures[name] = {
            "sentences": len(hyps),
            "bleu": scores.bleu,
            "chrf": scores.chrf,
            "bleu_signature": scores.bleu_signature,
            "hypotheses": str(path),
        }
    return figures
