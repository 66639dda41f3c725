"""`train(cfg)`: what `python run.py task=train` does, over the plain resolved config.

Seeds, builds the data module (data-bin preparation included) and the model from the
dictionaries' sizes, the Trainer with convseq's callbacks, fits (or continues a run: `resume`),
evaluates the test split with the best checkpoint, writes `<output_dir>/summary.json` and
prints one summary line. Returns the best value of `optimized_metric` (the best validation loss
by default), which run.py hands to Hydra sweepers.

Files in `<output_dir>` (= `paths.output_dir`, Hydra's run folder):

- `checkpoints/last.ckpt` (every epoch, and on SIGTERM/SIGINT in the middle of one),
  `checkpoints/best.ckpt` (best `checkpoint.monitor`), `checkpoints/epochNNN.ckpt` (optional),
  `checkpoints/crash.ckpt` (the state at a NaN or inf loss or gradient, which stops training);
- `csv/metrics.csv` (one file, continued by resumed runs);
- `generate-test.txt` (`gen.test_bleu`): the best checkpoint's test translations, detokenised, one
  per line, as `task=generate` writes them (what `task=compare` reads from a run folder);
- `summary.json`: epochs, updates, wall time, stop reason, best validation figures, test
  figures (loss, ppl, and BLEU/chrF of the best checkpoint's translations: `gen.test_bleu`; none
  with `final_test=false`, which never evaluates on test, for tuning runs) and
  the per-epoch history (lr, train and valid figures, time; `valid/bleu` with
  `bleu_every_n_epochs`), and with `profile=true` the mean breakdown of a training epoch.
"""

from __future__ import annotations

import importlib.util
import math
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint, Timer
from pytorch_lightning.utilities import rank_zero_info, rank_zero_only

from convseq.bleu import ValidBleu, model_scores, wants_valid_bleu
from convseq.callbacks import (
    AnnealingCallback,
    CrashCheckpoint,
    EpochCheckpoint,
    MaxUpdateCallback,
    RNGStateCallback,
    SignalCallback,
    TrainingInterrupted,
)
from convseq.checkpoint import (
    BEST,
    CHECKPOINT_DIR,
    CRASH,
    LAST,
    AtomicCheckpointIO,
    check_writable,
    load_checkpoint,
    remove_stale_temps,
    resolve_resume,
)
from convseq.data.databin import DataBin
from convseq.data.datamodule import BatchEpochCallback, TranslationDataModule
from convseq.data.preprocess import prepare_databin
from convseq.errors import CheckpointError
from convseq.loading import databin_text_processing
from convseq.module import ConvSeqModule, plain
from convseq.profile import EpochProfiler, LoggingTimer
from convseq.report import best_of
from convseq.run_log import (
    METRICS_FILE,
    SUMMARY_FILE,
    AppendingCSVLogger,
    truncate_metrics,
    write_summary,
)

__all__ = ["build_datamodule", "build_module", "build_trainer", "train"]


def build_module(cfg: Mapping[str, Any], databin: DataBin) -> ConvSeqModule:
    """A freshly initialised ConvSeqModule for the data-bin's dictionaries."""
    return ConvSeqModule(
        model=cfg["model"],
        src_vocab=databin.src_dict.to_list(),
        tgt_vocab=databin.tgt_dict.to_list(),
        optim=cfg["optim"],
        criterion=cfg.get("criterion") or {},
    )


def build_datamodule(cfg: Mapping[str, Any], module: ConvSeqModule) -> TranslationDataModule:
    """The data module, its length limits the tighter of the data's and the model's positions."""
    src_pos, tgt_pos = module.model.max_positions()
    max_pos = int(cfg["data"].get("max_positions", 1022))
    return TranslationDataModule(
        cfg["data"],
        cfg["batching"],
        cfg["paths"]["cache_dir"],
        seed=int(cfg.get("seed", 1)),
        max_source_positions=min(max_pos, src_pos),
        max_target_positions=min(max_pos, tgt_pos),
    )


def build_callbacks(cfg: Mapping[str, Any], ckpt_dir: Path) -> dict[str, pl.Callback]:
    """convseq's callbacks by name, in the order Lightning must call them."""
    ck = cfg.get("checkpoint") or {}
    monitor, mode = ck.get("monitor", "valid/loss"), ck.get("mode", "min")
    cbs: dict[str, pl.Callback] = {
        # First: advances the batch sampler's position before the signal handler saves it.
        "batches": BatchEpochCallback(),
        "anneal": AnnealingCallback(cfg["anneal"], lr=cfg["optim"]["lr"]),
        "max_update": MaxUpdateCallback(int(cfg.get("max_update") or 0)),
        "rng": RNGStateCallback(),
        "signal": SignalCallback(str(ckpt_dir / LAST)),
        "crash": CrashCheckpoint(str(ckpt_dir / CRASH)),
        "best": ModelCheckpoint(
            dirpath=str(ckpt_dir),
            filename=Path(BEST).stem,
            monitor=monitor,
            mode=mode,
            save_top_k=1,
            save_last=bool(ck.get("save_last", True)),
            auto_insert_metric_name=False,
            # At the very end of the epoch (after validation, annealing and the epoch's logs),
            # where Lightning resumes cleanly at the next epoch.
            save_on_train_epoch_end=True,
            enable_version_counter=False,
        ),
    }
    patience = int(cfg.get("patience", -1) or -1)
    if patience > 0:
        cbs["patience"] = EarlyStopping(monitor=monitor, mode=mode, patience=patience, verbose=True)
    keep = int(ck.get("keep_epochs", 0) or 0)
    if keep != 0:
        cbs["epochs"] = EpochCheckpoint(str(ckpt_dir), keep)
    every = wants_valid_bleu(cfg)
    if every:
        cbs["valid_bleu"] = ValidBleu(every, cfg.get("gen"))
    if cfg.get("profile"):
        cbs["profile"] = LoggingTimer()
    return cbs


def build_trainer(
    cfg: Mapping[str, Any], callbacks: list[pl.Callback], output_dir: Path
) -> pl.Trainer:
    """The Trainer of `cfg["trainer"]`, with convseq's fixed choices."""
    tcfg = {k: v for k, v in dict(cfg["trainer"]).items() if v is not None}
    max_epochs = int(tcfg.pop("max_epochs", 0) or 0)
    loggers: list[Any] = [AppendingCSVLogger(str(output_dir))]
    if importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX"):
        from pytorch_lightning.loggers import TensorBoardLogger

        loggers.append(TensorBoardLogger(str(output_dir), name="", version="tb"))
    clip = float(cfg["optim"].get("clip_norm") or 0.0)
    return pl.Trainer(
        **tcfg,
        max_epochs=max_epochs if max_epochs > 0 else -1,  # fairseq: 0 = no limit
        gradient_clip_val=clip if clip > 0 else None,
        gradient_clip_algorithm="norm",
        use_distributed_sampler=False,  # the batch sampler shards by rank itself
        default_root_dir=str(output_dir),
        callbacks=callbacks,
        logger=loggers,
        plugins=[AtomicCheckpointIO()],
        enable_model_summary=False,
        profiler=EpochProfiler() if cfg.get("profile") else None,
    )


def _check_resume(
    ckpt: Mapping[str, Any], module: ConvSeqModule, path: Path, databin: DataBin
) -> int:
    """Refuse a checkpoint of another model or vocabulary; return its logging step."""
    hp = ckpt.get("hyper_parameters")
    if not isinstance(hp, Mapping) or "model" not in hp or "tgt_vocab" not in hp:
        raise CheckpointError(
            f"{path}: not a convseq training checkpoint (no model hyperparameters)"
        )
    mine = module.hparams
    changed = sorted(
        k
        for k in set(hp["model"]) | set(mine["model"])
        if hp["model"].get(k) != mine["model"].get(k)
    )
    if changed:
        detail = ", ".join(
            f"{k}: {hp['model'].get(k)!r} there, {mine['model'].get(k)!r} now" for k in changed
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


def _stop_reason(trainer: pl.Trainer, cbs: Mapping[str, pl.Callback], max_epochs: int) -> str:
    for name in ("signal", "anneal", "max_update"):
        reason = getattr(cbs[name], "stop_reason", None)
        if reason:
            return reason
    es = cbs.get("patience")
    if isinstance(es, EarlyStopping) and es.stopped_epoch > 0:
        return f"no improvement of {es.monitor} in {es.patience} validations (patience)"
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    if timer is not None and (timer.time_remaining() or 0) <= 0:
        return "reached trainer.max_time"
    if trainer.fast_dev_run:
        return "fast_dev_run"
    if max_epochs > 0 and trainer.current_epoch >= max_epochs:
        return f"reached trainer.max_epochs={max_epochs}"
    return "finished"


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.4f}"


def _bleu(test: Mapping[str, Any]) -> str:
    return f" BLEU {test['test/bleu']:.2f}" if "test/bleu" in test else ""


@rank_zero_only
def _report(output_dir: Path, summary: dict[str, Any]) -> None:
    write_summary(output_dir / SUMMARY_FILE, summary)
    test = summary.get("test") or {}
    print(
        f"convseq: {summary['epochs']} epochs, {summary['updates']} updates in "
        f"{summary['train_seconds']:.1f}s; stopped: {summary['stop_reason']}; best "
        f"{summary['optimized_metric']} {_fmt(summary['best_value'])} (epoch "
        f"{summary['best_epoch']}); test loss {_fmt(test.get('test/loss'))} ppl "
        f"{_fmt(test.get('test/ppl'))}{_bleu(test)}; {output_dir}",
        flush=True,
    )


def train(cfg: Mapping[str, Any], callbacks: list[pl.Callback] | None = None) -> float:
    """Train (or continue training) the model `cfg` describes; see the module docstring.

    Args:
        cfg: the resolved config as plain dicts (`convseq.cli.to_plain`).
        callbacks: extra Lightning callbacks, called after convseq's own (except checkpointing,
            which Lightning always calls last).

    Returns:
        The best value of `cfg["optimized_metric"]` over the run's validations (NaN if none).

    Raises:
        ConvseqError: bad data, settings or checkpoints, with a message naming them.
    """
    cfg = plain(cfg)
    t_start = time.perf_counter()
    # Epoch-level figures are already summed over DDP ranks before they are logged.
    warnings.filterwarnings(
        "ignore", message=r"It is recommended to use `self.log\('(train_epoch|valid|test)/"
    )
    output_dir = Path(cfg["paths"]["output_dir"]).absolute()
    ckpt_dir = output_dir / CHECKPOINT_DIR
    resume = resolve_resume(cfg.get("resume", False), output_dir)
    if resume is None and (ckpt_dir / LAST).exists():
        raise CheckpointError(
            f"{ckpt_dir / LAST}: this folder already holds a run; continue it with resume=true "
            "or choose another hydra.run.dir"
        )
    if rank_zero_only.rank == 0:  # the only rank that writes checkpoints
        check_writable(ckpt_dir)  # an unwritable folder fails now, not after the first epoch
        if resume is not None:
            remove_stale_temps(ckpt_dir)  # left by a process killed while saving
    seed = int(cfg.get("seed", 1))
    pl.seed_everything(seed, workers=True, verbose=False)
    databin = DataBin(prepare_databin(cfg["data"], cfg["paths"]["cache_dir"]))
    module = build_module(cfg, databin)
    # the data's segmentation travels in the checkpoints: raw text translates without the data
    module.text_processing = databin_text_processing(databin)

    last_step = -1
    if resume is not None:
        ckpt = load_checkpoint(resume, weights_only=True)
        last_step = _check_resume(ckpt, module, resume, databin)
        del ckpt
        rank_zero_info(f"convseq: resuming from {resume}")

    dm = build_datamodule(cfg, module)
    cbs = build_callbacks(cfg, ckpt_dir)
    trainer = build_trainer(cfg, [*cbs.values(), *(callbacks or [])], output_dir)
    if resume is not None and last_step >= 0 and trainer.is_global_zero:
        truncate_metrics(output_dir / "csv" / METRICS_FILE, last_step)

    interrupted = False
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=str(resume) if resume else None)
    except TrainingInterrupted:
        interrupted = True

    # Taken before testing: loading best.ckpt for the test restores that epoch's module and
    # callback states.
    history = [dict(h) for h in module.history]
    seconds = module.training_seconds()
    best_path = getattr(cbs["best"], "best_model_path", "") or ""
    max_epochs = int(cfg["trainer"].get("max_epochs") or 0)
    reason = _stop_reason(trainer, cbs, max_epochs)
    epochs = trainer.current_epoch if not interrupted else len(history)
    updates = int(trainer.global_step)
    # final_test=false: a tuning run never evaluates on test
    evaluate = bool(cfg.get("final_test", True)) and not interrupted
    if evaluate:
        # a fast_dev_run tests the weights in memory, other runs best.ckpt's
        ckpt_path = None if trainer.fast_dev_run else (best_path or None)
        trainer.test(module, datamodule=dm, ckpt_path=ckpt_path, verbose=False)
    gen = cfg.get("gen") or {}
    test_hypotheses: Path | None = None
    if (
        evaluate
        and not trainer.fast_dev_run  # a smoke test: one batch, no full translation
        and gen.get("test_bleu", True)
        and trainer.is_global_zero
    ):
        # the module holds the weights just tested (best.ckpt's)
        scores, hyps = model_scores(module, dm.databin, "test", gen)
        module.test_figures.update({"test/bleu": scores.bleu, "test/chrf": scores.chrf})
        module.test_figures["test/bleu_signature"] = scores.bleu_signature
        test_hypotheses = output_dir / "generate-test.txt"
        test_hypotheses.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        for line in scores.lines():
            print(f"convseq: test {line}", flush=True)

    metric = str(cfg.get("optimized_metric") or "valid/loss")
    ck = cfg.get("checkpoint") or {}
    maximize = metric == ck.get("monitor") and ck.get("mode") == "max"
    best_value, best_epoch = best_of(history, metric, maximize)
    summary = {
        "epochs": epochs,
        "updates": updates,
        "train_seconds": seconds,
        "seconds_per_epoch": seconds / max(epochs, 1),
        "process_seconds": time.perf_counter() - t_start,
        "stop_reason": reason,
        "interrupted": interrupted,
        "optimized_metric": metric,
        "best_value": best_value,
        "best_epoch": best_epoch,
        "best_checkpoint": best_path or None,
        "last_checkpoint": str(ckpt_dir / LAST) if (ckpt_dir / LAST).exists() else None,
        "resumed_from": str(resume) if resume else None,
        "test": dict(module.test_figures),
        "test_hypotheses": str(test_hypotheses) if test_hypotheses else None,
        "history": history,
    }
    if isinstance(trainer.profiler, EpochProfiler):
        profiler = trainer.profiler
        summary["profile"] = {
            "epochs": profiler.epochs,
            "mean": profiler.mean(),
            "top_actions": profiler.top_actions(),
        }
        if trainer.is_global_zero:
            print(trainer.profiler.table(), flush=True)
    _report(output_dir, summary)
    return float(best_value)
