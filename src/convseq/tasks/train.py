"""`task=train`: `train(cfg)`, what `python run.py` does, over the typed config.

Seeds, prepares the data-bin (once: the data module is handed it), builds the model from the
dictionaries' sizes, the data module and the Trainer with convseq's callbacks, fits (or
continues a run: `resume`), evaluates the test split with the best checkpoint, writes
`<output_dir>/summary.json` and prints one summary line. Returns the best value of
`optimized_metric` (the best validation loss by default), which run.py hands to Hydra sweepers.

Files in `<output_dir>` (= `paths.output_dir`, Hydra's run folder):

- `checkpoints/last.ckpt` (every epoch, and on SIGTERM/SIGINT in the middle of one; under SLURM
  on SIGUSR1 too, after which rank 0 asks for `scontrol requeue`: `convseq.training.slurm`),
  `checkpoints/best.ckpt` (best `checkpoint.monitor`), `checkpoints/epochNNN.ckpt` (optional),
  `checkpoints/crash.ckpt` (the state at a NaN or inf loss or gradient, which stops training);
- `csv/metrics.csv` (one file, continued by resumed runs);
- `generate-test.txt` (`gen.test_bleu`): the best checkpoint's test translations, detokenised, one
  per line, as `task=generate` writes them (what `task=compare` reads from a run folder);
- `summary.json`: epochs, updates, wall time, stop reason, where training stopped
  (`stopped_at`, `last_validation`; `signal` and `continue_with` when a signal cut it short, which
  makes `python run.py` exit with 75, `EX_TEMPFAIL`), best validation figures, test
  figures (loss, ppl, and BLEU/chrF of the best checkpoint's translations: `gen.test_bleu`; none
  with `final_test=false`, which never evaluates on test, for tuning runs) and
  the per-epoch history (lr, train and valid figures, time; `valid/bleu` with
  `bleu_every_n_epochs`), every validation with the command's minutes when it ended, the
  minutes at which valid BLEU first reached each whole number (`minutes_to_valid_bleu`, also
  printed as one line: a run's own time to quality, start-up and data-bin included), and with
  `profile=true` the mean breakdown of a training epoch;
- `.hydra/` and `run.log`, Hydra's record of the command: in a folder that already holds a run,
  the command's own only once its checks have passed (`convseq.common.run_record`), and
  `error.txt` with the one-line error of a run that failed.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from pytorch_lightning.utilities import rank_zero_info, rank_zero_only

from convseq.checkpoints.io import (
    CHECKPOINT_DIR,
    LAST,
    check_writable,
    load_checkpoint,
    remove_stale_temps,
    resolve_resume,
)
from convseq.common.clock import command_start
from convseq.common.config import typed
from convseq.common.parallel_jobs import task_threads
from convseq.common.run_record import claim_run_folder
from convseq.data.preprocess import open_databin
from convseq.errors import CheckpointError
from convseq.evaluation.history import (
    METRICS_FILE,
    SUMMARY_FILE,
    time_to_quality_line,
)
from convseq.modules.conv_windows import training_forms
from convseq.optim.warmup import check_update_schedule
from convseq.training.bleu import wants_valid_bleu
from convseq.training.build import (
    build_callbacks,
    build_datamodule,
    build_module,
    build_trainer,
    check_resume,
)
from convseq.training.config import TrainConfig
from convseq.training.header import header_lines, log_header
from convseq.training.interruption import (
    exit_status,
    summary_line,
)
from convseq.training.noise import quiet_third_party
from convseq.training.run import Run, add_profile, final_test
from convseq.training.run import fit as run_fit
from convseq.training.run import summary as run_summary
from convseq.training.run_log import truncate_metrics, write_summary
from convseq.training.slurm import refuse_hpc_checkpoints, request_requeue
from convseq.training.thread_share import ThreadShare
from convseq.training.trackers import close_trackers, log_test_scores, tracker_resume

__all__ = ["run_train", "train"]


@rank_zero_only
def _report(output_dir: Path, summary: dict[str, Any]) -> None:
    write_summary(output_dir / SUMMARY_FILE, summary)
    print(summary_line(summary, output_dir), flush=True)
    reached = {int(n): m for n, m in (summary.get("minutes_to_valid_bleu") or {}).items()}
    line = time_to_quality_line(reached)
    if line:
        print(f"convseq: {line}", flush=True)


def train(
    cfg: TrainConfig | DictConfig | Mapping[str, Any], callbacks: list[pl.Callback] | None = None
) -> float:
    """Train (or continue training) the model `cfg` describes; see the module docstring.

    Args:
        cfg: the config: a `TrainConfig` (what the command line passes), or a DictConfig or a
            mapping of its keys, typed here (`convseq.common.config.typed`).
        callbacks: extra Lightning callbacks, called after convseq's own (except checkpointing,
            which Lightning always calls last).

    Returns:
        The best value of `cfg.optimized_metric` over the run's validations (NaN if none).

    Raises:
        ConvseqError: bad data, settings or checkpoints, with a message naming them.
    """
    with training_forms():  # LightConv's kernel forms: the same in every process (resume)
        return float(_train(cfg, callbacks)["best_value"])


def _train(
    cfg: TrainConfig | DictConfig | Mapping[str, Any], callbacks: list[pl.Callback] | None
) -> dict[str, Any]:
    """`train`'s work; returns the run's summary (what summary.json holds)."""
    cfg = typed(TrainConfig, cfg, "config")
    t_start = time.perf_counter()
    started = command_start()  # the clock of the run's time to quality
    # Epoch-level figures are already summed over DDP ranks before they are logged.
    warnings.filterwarnings(
        "ignore", message=r"It is recommended to use `self.log\('(train_epoch|valid|test)/"
    )
    quiet_third_party()  # Lightning's litlogger tip and its own deprecation warning
    output_dir = Path(cfg.paths.output_dir).absolute()
    resume = _open_run_folder(cfg, output_dir)
    run, last_step = _build_run(cfg, output_dir, resume, callbacks)
    _take_run_folder(run, last_step)  # the checks passed: from here on the folder is this run's
    run.module.command_started = started
    fit = run_fit(run)
    test_hypotheses, test_sets = final_test(run, fit)
    # test BLEU/chrF come after trainer.test: the trackers get them here
    log_test_scores(run.trainer, run.module.test_figures, run.module.global_step)
    close_trackers(run.trainer, interrupted=fit.signal is not None)
    summary = run_summary(run, fit, test_hypotheses, test_sets, t_start)
    add_profile(run.trainer, summary)
    _report(output_dir, summary)
    _requeue(run)
    return summary


def _requeue(run: Run) -> None:
    """After the requeue signal (SIGUSR1 under SLURM): rank 0 asks SLURM to requeue the job, last
    of all, since SLURM ends the job as soon as it does (`convseq.training.slurm`)."""
    if getattr(run.callbacks["signal"], "requeue", False) and run.trainer.is_global_zero:
        print(request_requeue(), flush=True)


def _open_run_folder(cfg: TrainConfig, output_dir: Path) -> Path | None:
    """The checkpoint to resume from (None: a new run), the run folder checked for it.

    A new run refuses a folder that already holds one (`resume=auto` continues it instead; a
    folder without checkpoints/last.ckpt is new to it); rank 0 (the only rank that writes
    checkpoints) checks that the checkpoint folder is writable. Nothing of an existing run
    changes here (`_take_run_folder` comes after every check).
    """
    ckpt_dir = output_dir / CHECKPOINT_DIR
    resume = resolve_resume(cfg.resume, output_dir)
    refuse_hpc_checkpoints(output_dir, resume)  # Lightning would continue from one by itself
    if resume is None and (ckpt_dir / LAST).exists():
        raise CheckpointError(
            f"{ckpt_dir / LAST}: this folder already holds a run; continue it with resume=true "
            "(or resume=auto, which also starts a new run where there is none) or choose another "
            "hydra.run.dir"
        )
    if rank_zero_only.rank == 0:  # the only rank that writes checkpoints
        check_writable(ckpt_dir)  # an unwritable folder fails now, not after the first epoch
    return resume


def _take_run_folder(run: Run, last_step: int) -> None:
    """The run's checks have passed: its record (Hydra's .hydra/ and run.log, staged beside an
    existing run's until now: `convseq.common.run_record`) replaces the folder's; on rank 0 a
    resumed run removes the temporary files of a process killed while saving and the
    metrics.csv rows logged after its checkpoint."""
    claim_run_folder()
    if run.resume is None:
        return
    if rank_zero_only.rank == 0:  # the only rank that writes checkpoints
        remove_stale_temps(run.ckpt_dir)  # left by a process killed while saving
    if last_step >= 0 and run.trainer.is_global_zero:
        truncate_metrics(run.output_dir / "csv" / METRICS_FILE, last_step)


def _build_run(
    cfg: TrainConfig,
    output_dir: Path,
    resume: Path | None,
    callbacks: list[pl.Callback] | None,
) -> tuple[Run, int]:
    """Seed, prepare the data-bin, build the module (checked against ``resume``), the data
    module, convseq's callbacks and the Trainer; with the step of the checkpoint resumed from
    (-1: none)."""
    ckpt_dir = output_dir / CHECKPOINT_DIR
    threads = task_threads(cfg.trainer)  # each process's share of the CPUs, before anything runs
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    # a schedule or a BLEU period that cannot run fails now, not after the data-bin is built
    check_update_schedule(cfg.anneal, cfg.optim.lr, cfg.max_update)
    wants_valid_bleu(cfg)
    databin = open_databin(cfg.data, cfg.paths.cache_dir)  # convseq's or fairseq's
    module = build_module(cfg, databin)
    # the data's segmentation travels in the checkpoints: raw text translates without the data
    module.text_processing = databin.text_processing()

    last_step, trackers = -1, {}
    if resume is not None:
        ckpt = load_checkpoint(resume, weights_only=True)
        last_step = check_resume(ckpt, module, resume, databin)
        trackers = tracker_resume(ckpt)  # the tracker runs to continue
        del ckpt
        rank_zero_info(f"convseq: resuming from {resume}")

    dm = build_datamodule(cfg, module, databin)  # the data-bin prepared above, used as it is
    cbs = build_callbacks(cfg, ckpt_dir, resume)
    cbs["threads"] = ThreadShare(threads)  # every rank, once the ranks know each other
    trainer = build_trainer(cfg, [*cbs.values(), *(callbacks or [])], output_dir, trackers)
    if rank_zero_only.rank == 0:
        log_header(header_lines(cfg, module, databin.sizes(), threads, output_dir))
    return Run(cfg, output_dir, resume, module, dm, cbs, trainer), last_step


def _in_multirun() -> bool:
    """Whether this is a job of a Hydra multirun (`-m`), whose sweep a SystemExit would end."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def run_train(cfg: TrainConfig) -> float:
    """`python run.py task=train`: train, and return the best `optimized_metric` value.

    A run cut short by a signal exits with 75 (`EX_TEMPFAIL`) once its summary is written: on
    rank 0 only (Lightning's launcher kills rank 0 when another rank exits non-zero first; srun
    reports the highest status of its tasks), and not inside a multirun, where the sweep report
    marks the job interrupted instead.
    """
    summary = _train(cfg, None)
    status = exit_status(summary)
    if status and rank_zero_only.rank == 0 and not _in_multirun():
        raise SystemExit(status)
    return float(summary["best_value"])
