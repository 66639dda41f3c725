"""Stopping on a signal and saving at a failure: SIGTERM/SIGINT (and SLURM's requeue signal)
end training at an update boundary with a resumable checkpoint; a NaN or inf leaves crash.ckpt.

Both record why the run ended in `stop_reason`, as the callbacks of `convseq.training.callbacks`.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.utilities import rank_zero_info

from convseq.errors import NonFiniteError
from convseq.training.callbacks import stop_training


class TrainingInterrupted(Exception):
    """Raised to end `fit` after SIGTERM/SIGINT once a resumable checkpoint is written."""


class SignalCallback(pl.Callback):
    """SIGTERM / SIGINT: finish the current update, save a resumable checkpoint, stop cleanly.

    In the middle of an epoch, the checkpoint is written at the end of the first update that
    ends after the signal (`checkpoint_path`, normally last.ckpt) and `TrainingInterrupted` is
    raised before the next batch; the resumed run continues at that next batch. A signal during
    an epoch's last update or its validation lets the epoch finish, so that validation,
    annealing and the end-of-epoch checkpoint happen as in an uninterrupted run, then stops. A
    second SIGINT aborts at once (KeyboardInterrupt). Under DDP the ranks agree on the signal
    at every update, so they stop at the same one.

    `requeue_signal` (SIGUSR1 under SLURM, `convseq.training.slurm`) stops the run the same way;
    `requeue` then tells the caller to ask for a requeue, on every rank if any rank received it.

    Args:
        checkpoint_path: where the mid-epoch checkpoint goes.
        requeue_signal: the signal that also asks for a requeue (None: none).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, checkpoint_path: str, requeue_signal: int | None = None):
        self.checkpoint_path = str(checkpoint_path)
        self.requeue_signal = int(requeue_signal) if requeue_signal is not None else None
        self.received: int | None = None
        self.stop_reason: str | None = None
        self.interrupted = False  # True once a mid-epoch checkpoint was written
        self._raise_next = False
        self._originals: dict[int, Any] = {}
        self._group: Any = None  # gloo process group of the signal flag (DDP only)

    # -- handlers -------------------------------------------------------------------------------
    def _handler(self, signum: int, frame: Any) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.received = signum

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and threading.current_thread() is threading.main_thread():
            self._originals = {s: signal.getsignal(s) for s in self._signals()}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Installed here, after Lightning's own SIGTERM handler (set up just before training),
        # so that the signal is handled only here, at update boundaries.
        if threading.current_thread() is threading.main_thread():
            for s in self._signals():
                signal.signal(s, self._handler)

    def _signals(self) -> tuple[int, ...]:
        extra = () if self.requeue_signal is None else (self.requeue_signal,)
        return (*self.SIGNALS, *extra)

    @property
    def requeue(self) -> bool:
        """Whether the run was stopped by the requeue signal (on any rank)."""
        return self.requeue_signal is not None and self.received == self.requeue_signal

    def _restore(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for s, handler in self._originals.items():
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        self._originals = {}

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._restore()

    # -- stopping -------------------------------------------------------------------------------
    def _agreed(self, trainer: pl.Trainer) -> bool:
        """Whether any rank has received a signal (one small all-reduce under DDP).

        The flag travels as a CPU tensor over a gloo group: reading an all-reduced GPU tensor
        would make the host wait for every queued kernel at every update.
        """
        # 0: no signal, 1: SIGTERM/SIGINT, 2: the requeue signal, which wins (MAX) so that
        # every rank knows the run is to be requeued, whichever rank SLURM's signal reached
        code = 0 if self.received is None else 2 if self.requeue else 1
        if trainer.world_size > 1:
            t = torch.tensor([float(code)])  # (1,) on the CPU
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._host_group())
            agreed = int(t[0])
            if agreed == 2 and not self.requeue:
                self.received = self.requeue_signal
            elif agreed == 1 and self.received is None:
                self.received = int(signal.SIGTERM)
            code = agreed
        return code > 0

    def _host_group(self) -> Any:
        """The process group for CPU tensors: the default one if it is gloo's, else a gloo one."""
        if self._group is None:
            default = dist.group.WORLD
            is_gloo = dist.get_backend(default) == dist.Backend.GLOO
            self._group = default if is_gloo else dist.new_group(backend="gloo")
        return self._group

    def _name(self) -> str:
        try:
            return signal.Signals(self.received).name
        except (ValueError, TypeError):
            return f"signal {self.received}"

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            return  # the epoch's end stops instead (on_train_epoch_end)
        if (batch_idx + 1) % trainer.accumulate_grad_batches != 0:
            return  # in the middle of an update
        if not self._agreed(trainer):
            return
        trainer.save_checkpoint(self.checkpoint_path, weights_only=False)
        self.interrupted = True
        self._raise_next = True
        self.stop_reason = (
            f"{self._name()} during epoch {trainer.current_epoch + 1}: saved "
            f"{self.checkpoint_path} after update {trainer.global_step}"
        )
        rank_zero_info(f"convseq: stopping: {self.stop_reason}")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._raise_next:
            raise TrainingInterrupted(self.stop_reason)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._agreed(trainer):
            stop_training(trainer, self, f"{self._name()} during epoch {trainer.current_epoch + 1}")


class CrashCheckpoint(pl.Callback):
    """On a NaN or inf loss or gradient (`NonFiniteError`), saves the state at the failure.

    The file (`checkpoint_path`, normally crash.ckpt beside last.ckpt) is for inspection, as
    fairseq's crash.pt; last.ckpt and best.ckpt are never written with that state. The error's
    message then names the file. A failure to write it is reported without hiding the error.

    Args:
        checkpoint_path: where the state goes.
    """

    def __init__(self, checkpoint_path: str):
        self.checkpoint_path = str(checkpoint_path)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, NonFiniteError):
            return
        try:
            trainer.save_checkpoint(self.checkpoint_path, weights_only=False)
        except Exception as e:  # a full disk must not replace the NaN error
            rank_zero_info(f"convseq: could not save {self.checkpoint_path}: {e}")
            return
        exception.crash_checkpoint = self.checkpoint_path
