"""The job log: a progress line every `trainer.log_every_n_steps` updates where no terminal is
attached, and a line per validation, checkpoint and stop.

A slow run also gets a line when `trainer.progress_seconds` (30 s) have passed since the last line, the
first within about 30 s of the training's start: at 6 s an update, 50 updates would leave the log
silent for 5 minutes. Such a line says where the run is (update, elapsed, epoch eta) without the
per-update figures, which come with the lines of the updates Lightning logs. A fast run's lines
stay those of `trainer.log_every_n_steps`: the time adds a line only where they are further apart.

A progress bar redraws one line in place, so stdout sent to a file (SLURM, `nohup`, CI) holds
nothing until the run ends. `ProgressLines` writes instead, on rank 0, through the `logging`
logger `convseq.progress` (Hydra sends it to stdout and to the run folder's run.log):

    epoch 1 | update 50/250 (50) | loss 8.173 | nll 8.173 | ppl 288.6 | lr 0.25 | gnorm 0.595 |
      wps 4085 | ups 4.64 | elapsed 0:00:11 | epoch eta 0:00:44          (one line)
    epoch 1 | valid | loss 5.034 | nll 4.725 | ppl 26.45 | best valid/loss 5.034 | lr 0.25
    epoch 1 | update 250 | saved checkpoints/best.ckpt
    stopped: reached trainer.max_epochs=1 | epochs 1 | updates 250 | elapsed 0:01:02
    stopped: reached max_update=300 updates | epochs 1 and update 50/250 of epoch 2 | updates 300 |
      elapsed 0:01:14                                                      (one line)

`trainer.progress=json` writes the same records as one JSON object a line, with a `kind`
(update | valid | checkpoint | stop), nothing else on the line; an update record's `logged` says
whether it holds the update's figures (false: a line by time). The per-update figures are the
ones Lightning has just written to csv/metrics.csv (`trainer.logged_metrics` right after it
logged them, read at the next hook): nothing is computed a second way, and no value is read
from the device on an update that does not log.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from convseq.common.config import TrainerConfig
from convseq.errors import SettingError
from convseq.training.interruption import epochs_done, last_epoch_complete, stop_point
from convseq.training.log_interval import updates_per_epoch
from convseq.training.progress_format import format_record, json_number, plain_value
from convseq.training.signals import TrainingInterrupted

__all__ = ["EVERY_SECONDS", "MODES", "ProgressLines", "format_record", "progress_mode"]

MODES = ("auto", "bar", "lines", "json", "none")
# a progress line at the first update this many seconds after the last line (or the start):
# trainer.progress_seconds's default (its one home is the schema)
EVERY_SECONDS = TrainerConfig.progress_seconds
LOGGER = "convseq.progress"
# per-update figures of csv/metrics.csv (train/<name>) in the records, in this order
_UPDATE_FIGURES = ("loss", "nll_loss", "ppl", "lr", "gnorm", "wps", "ups", "wpb", "bsz", "clip")


def _interactive() -> bool:
    """Whether a person watches stdout: a terminal, or a notebook (whose bar draws in place)."""
    if "ipykernel" in sys.modules:
        return True
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed stdout
        return False


def progress_mode(trainer_cfg: TrainerConfig, interactive: bool | None = None) -> str:
    """The run's progress output: bar | lines | json | none, from `trainer.progress` and
    `trainer.enable_progress_bar`.

    `auto` is the bar on a terminal (or in a notebook) and lines otherwise.
    `enable_progress_bar=false` means no bar: on a terminal nothing then, elsewhere still lines
    (which it never turned off); `progress=bar` with it is none.
    """
    mode = trainer_cfg.progress
    if mode not in MODES:
        raise SettingError(f"trainer.progress={mode!r}: choose one of {', '.join(MODES)}")
    bar_allowed = trainer_cfg.enable_progress_bar
    if mode == "auto":
        tty = _interactive() if interactive is None else interactive
        mode = "bar" if tty else "lines"
    if mode == "bar" and not bar_allowed:
        return "none"
    return mode


def _since_best(values: list[float], mode: str) -> int:
    """Validations after the last that beat every one before it (EarlyStopping's wait count
    with min_delta 0, once it has seen them all)."""
    best = 0
    for i, v in enumerate(values):
        if (v > values[best]) if mode == "max" else (v < values[best]):
            best = i
    return len(values) - 1 - best


def _json_logger() -> logging.Logger:
    """`convseq.progress.json`: the bare JSON line to stdout and to the run's log files.

    Its own handlers (no timestamp prefix), so that each line parses as it is; the files are
    those of the root logger's file handlers (Hydra's run.log).
    """
    log = logging.getLogger(f"{LOGGER}.json")
    if log.handlers:
        return log
    bare = logging.Formatter("%(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stdout)]
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            handlers.append(logging.FileHandler(h.baseFilename, encoding="utf-8"))
    for h in handlers:
        h.setFormatter(bare)
        log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False
    return log


def _lines_logger() -> logging.Logger:
    """`convseq.progress`, through the root logger's handlers (Hydra's stdout and run.log); a
    stdout handler of its own where logging is not configured (a notebook, a script)."""
    log = logging.getLogger(LOGGER)
    if not logging.getLogger().handlers and not log.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    elif log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    return log


class ProgressLines(pl.Callback):
    """Writes the job log's records on rank 0 (see the module docstring).

    Args:
        fmt: "lines" (text) or "json" (one object a line).
        stop_reason: why training stopped, given the Trainer (the summary's `stop_reason`).
        monitor: the metric that picks best.ckpt, and its mode (min | max), for "best so far".
        patience: the EarlyStopping callback, if any (its patience left goes in valid lines).
        every_seconds: a line at the first update this long after the last line, besides those
            every log_every_n_steps updates (0: none by time).
        clock: the time in seconds (`time.monotonic`; a test's fake clock).
    """

    def __init__(
        self,
        fmt: str,
        stop_reason: Callable[[pl.Trainer], str] | None = None,
        monitor: tuple[str, str] = ("valid/loss", "min"),
        patience: pl.Callback | None = None,
        every_seconds: float = EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if fmt not in ("lines", "json"):
            raise ValueError(f"ProgressLines writes lines or json, not {fmt!r}")
        self.fmt = fmt
        self.stop_reason = stop_reason
        self.monitor = monitor
        self.patience = patience
        self._log: logging.Logger | None = None
        self._pending_update: dict[str, Any] | None = None  # logged, not yet written
        self._pending_valid = False
        self.every_seconds = float(every_seconds)
        self._clock = clock
        self._t0 = clock()
        self._epoch_t0 = self._t0
        self._last_line = self._t0  # when the last line was written (or training started)
        # updates of the epoch done before this process trained its first batch of it
        self._epoch_first: int | None = 0

    # -- output ---------------------------------------------------------------------------------
    def emit(self, record: dict[str, Any]) -> None:
        """Write one record (rank 0 only) as a text line or a JSON object."""
        if self._log is None:
            self._log = _json_logger() if self.fmt == "json" else _lines_logger()
        if self.fmt == "json":
            line = json.dumps({k: json_number(v) for k, v in record.items()})
        else:
            line = format_record(record)
        self._log.info(line)
        self._last_line = self._clock()

    # -- where we are ---------------------------------------------------------------------------
    @staticmethod
    def _epoch_updates(trainer: pl.Trainer) -> int | None:
        batches = trainer.num_training_batches
        if isinstance(batches, float) and not math.isfinite(batches):
            return None
        return updates_per_epoch(int(batches), trainer.accumulate_grad_batches)

    @staticmethod
    def _epoch_update(trainer: pl.Trainer) -> int:
        """Updates done in the current epoch (a resumed epoch counts those before the stop)."""
        done = trainer.fit_loop.epoch_loop.batch_progress.current.completed
        return updates_per_epoch(int(done), trainer.accumulate_grad_batches)

    # -- hooks ----------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        listeners = getattr(trainer.strategy.checkpoint_io, "saved_listeners", None)
        if stage == "fit" and listeners is not None and self._saved not in listeners:
            listeners.append(self._saved)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._t0 = self._last_line = self._clock()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # taken at the epoch's first batch: Lightning resets its batch counter after this hook
        self._epoch_first = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not trainer.is_global_zero or trainer.fit_loop._should_accumulate():
            return
        now = self._clock()
        # Lightning's own test, which it makes right after this hook to log the update
        logged = bool(trainer._logger_connector.should_update_logs or trainer.fast_dev_run)
        if not (logged or self._line_due(trainer, now)):
            return
        # this batch is not yet counted as completed
        done = trainer.fit_loop.epoch_loop.batch_progress.current.completed + 1
        in_epoch = updates_per_epoch(done, trainer.accumulate_grad_batches)
        total = self._epoch_updates(trainer)
        done_here = in_epoch - (self._epoch_first or 0)
        eta = None
        if total and done_here > 0:
            eta = (now - self._epoch_t0) / done_here * max(total - in_epoch, 0)
        step = trainer.fit_loop.epoch_loop._batches_that_stepped  # metrics.csv's `step`
        self._pending_update = {
            "kind": "update",
            "epoch": trainer.current_epoch + 1,
            "epoch_update": in_epoch,
            "epoch_updates": total,
            "updates": step + 1,
            "step": step,
            "elapsed": now - self._t0,
            "epoch_eta": eta,
            "logged": logged,  # false: a line by time, without the update's figures
        }

    def _line_due(self, trainer: pl.Trainer, now: float) -> bool:
        """A line by time: `every_seconds` since the last line (per-update lines are on)."""
        if self.every_seconds <= 0 or trainer.log_every_n_steps <= 0:
            return False
        return now - self._last_line >= self.every_seconds

    def _flush(self, trainer: pl.Trainer) -> None:
        """Write what Lightning logged since the last hook (an update's figures, a validation)."""
        if self._pending_update is not None:
            record, self._pending_update = self._pending_update, None
            # a line by time: what Lightning last logged is an earlier update's
            logged = trainer.logged_metrics if record["logged"] else {}
            for name in _UPDATE_FIGURES:
                if f"train/{name}" in logged:
                    record[name] = plain_value(logged[f"train/{name}"])
            self.emit(record)
        if self._pending_valid:
            self._pending_valid = False
            self.emit(self._valid_record(trainer))

    def _valid_record(self, trainer: pl.Trainer) -> dict[str, Any]:
        module = trainer.lightning_module
        validations = getattr(module, "validations", [])
        last = validations[-1] if validations else {}
        record: dict[str, Any] = {
            "kind": "valid",
            "epoch": last.get("epoch", trainer.current_epoch + 1),
            "updates": last.get("updates", trainer.global_step),
        }
        for key in ("loss", "nll_loss", "ppl", "bleu", "chrf"):
            if f"valid/{key}" in last:
                record[key] = last[f"valid/{key}"]
        metric, mode = self.monitor
        seen = [v[metric] for v in validations if isinstance(v.get(metric), (int, float))]
        seen = [x for x in seen if math.isfinite(x)]
        if seen:
            record["best_metric"] = metric
            record["best"] = max(seen) if mode == "max" else min(seen)
        es = self.patience
        if es is not None and seen:
            # from the records, not es.wait_count: EarlyStopping may count this validation
            # only after the line is written (at the epoch's end, after best.ckpt is saved)
            record["patience_left"] = max(int(es.patience) - _since_best(seen, mode), 0)
        if trainer.optimizers:  # after annealing: the lr of the updates that follow
            record["lr"] = float(trainer.optimizers[0].param_groups[0]["lr"])
        return record

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._flush(trainer)
        if self._epoch_first is None:  # the first batch this process trains in the epoch
            self._epoch_t0 = self._clock()
            self._epoch_first = self._epoch_update(trainer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # written at the next hook: the lr is annealed after the validation (at the epoch's
        # end, or right after it with validations by updates)
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._pending_valid = True

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush(trainer)

    def _saved(self, path: Path) -> None:
        trainer = getattr(self, "_trainer", None)
        if trainer is None:
            return
        self._flush(trainer)
        try:
            shown = str(path.relative_to(Path(trainer.default_root_dir).absolute()))
        except ValueError:
            shown = str(path)
        self.emit(
            {
                "kind": "checkpoint",
                "epoch": trainer.current_epoch + 1,
                "updates": trainer.global_step,
                "path": shown,
            }
        )

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # the Trainer whose checkpoints `_saved` reports (rank 0 only writes them)
        self._trainer = trainer if trainer.is_global_zero else None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        self._flush(trainer)
        self._stopped(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if trainer.is_global_zero:
            self._flush(trainer)
            self._stopped(trainer, exception)

    def _stopped(self, trainer: pl.Trainer, exception: BaseException | None = None) -> None:
        if exception is not None and not isinstance(exception, TrainingInterrupted):
            reason = f"{type(exception).__name__}: {exception}"
        else:
            reason = self.stop_reason(trainer) if self.stop_reason else "finished"
        record = {
            "kind": "stop",
            "reason": reason,
            **self._epochs(trainer, mid_epoch=exception is not None),
            "updates": trainer.global_step,
            "elapsed": self._clock() - self._t0,
        }
        self.emit(record)

    @staticmethod
    def _epochs(trainer: pl.Trainer, mid_epoch: bool) -> dict[str, Any]:
        """The stop record's epochs: those completed, the updates of a partial last one (its
        `epoch_update` of `epoch_updates`) and the epochs as a number (`epochs_trained`)."""
        module = trainer.lightning_module
        history = list(getattr(module, "history", []))
        updates = int(getattr(module, "updates", trainer.global_step))
        at = stop_point(trainer, history, updates, mid_epoch)
        # after an exception the epoch it came in is not in the history (or it ended)
        done = epochs_done(at, complete=mid_epoch or last_epoch_complete(trainer))
        record: dict[str, Any] = {"epochs": done.completed, "epochs_trained": done.trained}
        if done.partial_updates:
            record["epoch_update"] = done.partial_updates
            record["epoch_updates"] = done.epoch_updates
        return record

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        listeners = getattr(trainer.strategy.checkpoint_io, "saved_listeners", None)
        if listeners is not None and self._saved in listeners:
            listeners.remove(self._saved)
        self._trainer = None
