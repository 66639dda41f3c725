"""Training callbacks: the batch order, annealing, update limit, RNG state, epoch checkpoints.

SIGTERM/SIGINT and the crash checkpoint are in `convseq.training.signals`.

Each callback that ends training records why in `stop_reason` (and logs it), so that the run's
summary can say which limit fired. State that a resumed run needs (the annealer, the RNG) is
kept in the callbacks' `state_dict`, which Lightning stores in every checkpoint, as plain values
and tensors that `torch.load(weights_only=True)` accepts.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities import rank_zero_info
from torch.utils.data import DataLoader

from convseq.common.distributed import rank_and_world
from convseq.data.batching import TokenBatchSampler
from convseq.inference.sharding import gather_objects
from convseq.optim.anneal import Annealer
from convseq.optim.config import AnnealConfig
from convseq.optim.warmup import UPDATE_SCHEDULES, UpdateSchedule


def _train_samplers(trainer: pl.Trainer) -> list[TokenBatchSampler]:
    """The TokenBatchSamplers behind the trainer's train loader(s)."""
    found: list[TokenBatchSampler] = []

    def visit(obj: Any) -> None:
        if isinstance(obj, DataLoader):
            sampler = getattr(obj, "batch_sampler", None)
            sampler = getattr(sampler, "_batch_sampler", sampler)  # Lightning's index wrapper
            if isinstance(sampler, TokenBatchSampler):
                found.append(sampler)
        elif isinstance(obj, Mapping):
            for v in obj.values():
                visit(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                visit(v)

    visit(trainer.train_dataloader)
    return found


class BatchEpochCallback(pl.Callback):
    """Tells the train batch sampler the epoch, and counts the batches trained on.

    `convseq.data.datamodule.TranslationDataModule` needs it among the Trainer's callbacks
    (it warns without one: the `DRIVES_BATCH_SAMPLER` flag).

    Lightning calls `set_epoch` only on `loader.sampler` and `loader.batch_sampler.sampler`,
    never on the batch sampler itself, so without this the batch order would repeat every epoch.
    Counting finished batches (not yielded ones, which run ahead when workers prefetch) makes a
    checkpoint taken mid-epoch resume at the next batch; this runs before ModelCheckpoint's hook,
    which Lightning always orders last.
    """

    drives_batch_sampler = True  # convseq.data.datamodule.DRIVES_BATCH_SAMPLER

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for sampler in _train_samplers(trainer):
            sampler.set_epoch(trainer.current_epoch)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        for sampler in _train_samplers(trainer):
            sampler.advance()


def _set_lr(trainer: pl.Trainer, lr: float) -> None:
    for optimizer in trainer.optimizers:
        for group in optimizer.param_groups:
            group["lr"] = lr


def stop_training(trainer: pl.Trainer, owner: Any, reason: str) -> None:
    """Ask Lightning to stop after this epoch (or update); `owner.stop_reason` says why, once."""
    if owner.stop_reason is None:
        owner.stop_reason = reason
        rank_zero_info(f"convseq: stopping: {reason}")
    trainer.should_stop = True


def _at_epoch_boundary(trainer: pl.Trainer) -> bool:
    """Whether training (re)starts at an epoch's first batch, not in the middle of one."""
    loop = trainer.fit_loop
    return not (loop.restarted_mid_epoch or loop.restarted_on_epoch_end)


class AnnealingCallback(pl.Callback):
    """Drives `Annealer`: the lr at each epoch start and after validation; stops below min_lr.

    With ``by_validation`` (validations by updates, `convseq.training.intervals`) the rule steps
    after every validation instead, and its "epochs" are validations: ``force_anneal=N`` anneals
    from the N-th validation period on, ``min_epoch_to_anneal`` counts validations, plateau's
    patience counts validations as always.

    Epochs are 1-based (Lightning's ``current_epoch + 1``). The lr for the next epoch is set on
    the optimiser right after the epoch's validation, so checkpoints taken at the end of an epoch
    already hold it, and a run whose next lr falls below ``anneal.min_lr`` stops there.

    Args:
        anneal_cfg: the `anneal` config.
        lr: the initial learning rate (``optim.lr``).
    """

    def __init__(
        self,
        anneal_cfg: AnnealConfig,
        lr: float,
        by_validation: bool = False,
        max_update: int = 0,
    ):
        self.annealer = Annealer(anneal_cfg, lr=lr)
        # inverse_sqrt / cosine: the lr of every update (the epoch rule keeps it constant)
        self.schedule = (
            UpdateSchedule(anneal_cfg, lr=lr, max_update=max_update)
            if self.annealer.name in UPDATE_SCHEDULES
            else None
        )
        self.stop_reason: str | None = None
        self.by_validation = bool(by_validation)
        self.validations = 0  # with by_validation: validations so far (the rules' "epochs")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.schedule is not None:
            _set_lr(trainer, self.schedule.lr_at(int(pl_module.updates) + 1))
            return
        if self.by_validation:
            # the lr of the period after the last validation (resumed runs: already set)
            lr = self.annealer.lr_at_epoch_start(self.validations + 1)
            _set_lr(trainer, lr)
            if self.annealer.should_stop(lr):
                stop_training(trainer, self, self.annealer.stop_reason)
            return
        # A resumed run that had already annealed below min_lr stops before another epoch.
        if _at_epoch_boundary(trainer):
            lr = self.annealer.lr_at_epoch_start(trainer.current_epoch + 1)
            if self.annealer.should_stop(lr):
                stop_training(trainer, self, self.annealer.stop_reason)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.by_validation and self.schedule is None:
            _set_lr(trainer, self.annealer.lr_at_epoch_start(trainer.current_epoch + 1))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        """A schedule by update: the lr of the update this batch belongs to."""
        if self.schedule is not None:
            _set_lr(trainer, self.schedule.lr_at(int(pl_module.updates) + 1))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.schedule is not None:
            reason = self.schedule.finished(int(pl_module.updates))
            if reason:
                stop_training(trainer, self, reason)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """With validations by updates: one step of the rule per validation."""
        if not self.by_validation or trainer.sanity_checking:
            return
        if self.schedule is not None:
            self.validations += 1
            return
        self.validations += 1
        self.annealer.step(self.validations, getattr(pl_module, "valid_loss", None))
        lr = self.annealer.lr_at_epoch_start(self.validations + 1)
        _set_lr(trainer, lr)
        if self.annealer.should_stop(lr):
            stop_training(trainer, self, self.annealer.stop_reason)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.schedule is not None:  # the next update's lr (what checkpoints and logs show)
            _set_lr(trainer, self.schedule.lr_at(int(pl_module.updates) + 1))
            return
        if self.by_validation:
            return
        epoch = trainer.current_epoch + 1
        validated = getattr(pl_module, "valid_epoch", None) == trainer.current_epoch
        val = getattr(pl_module, "valid_loss", None) if validated else None
        self.annealer.step(epoch, val)
        lr = self.annealer.lr_at_epoch_start(epoch + 1)
        _set_lr(trainer, lr)
        if self.annealer.should_stop(lr):
            stop_training(trainer, self, self.annealer.stop_reason)

    def state_dict(self) -> dict[str, Any]:
        return {"annealer": self.annealer.state_dict(), "validations": self.validations}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.annealer.load_state_dict(state_dict["annealer"])
        self.validations = int(state_dict.get("validations", 0))


class MaxUpdateCallback(pl.Callback):
    """Stops after `max_update` updates (fairseq's --max-update; 0 = no limit)."""

    def __init__(self, max_update: int):
        self.max_update = int(max_update)
        self.stop_reason: str | None = None

    def _check(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # updates the fp16 loss scaler skipped do not count (Lightning's global_step does)
        updates = trainer.global_step - int(getattr(pl_module, "skipped_updates", 0))
        if self.max_update > 0 and updates >= self.max_update:
            stop_training(trainer, self, f"reached max_update={self.max_update} updates")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._check(trainer, pl_module)


def capture_rng() -> dict[str, Any]:
    """Every global RNG's state as tensors and ints (what weights_only loading accepts)."""
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": {
            "version": version,
            "state": torch.tensor(mt, dtype=torch.int64),
            "gauss": gauss,
        },
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Set every global RNG from `capture_rng()`'s result."""
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    n = state["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


PER_RANK = "per_rank"  # RNGStateCallback's entry for the states of several ranks


class RNGStateCallback(pl.Callback):
    """Makes dropout draw the same numbers whether or not a run was interrupted and resumed.

    The RNG state is saved with every checkpoint and set again just before the first batch a
    resumed run trains. Between a checkpoint and that batch an uninterrupted run may consume
    random numbers that a resumed one does not (each new DataLoader iterator draws a seed from
    torch's global generator, and a resumed run creates its iterator earlier); so every epoch
    also sets, before its first batch, the state the epoch started with, which makes that draw
    invisible in both.
    """

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._pending is None:
            self._pending = capture_rng()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._pending is not None:
            restore_rng(self._pending)
            self._pending = None

    def state_dict(self) -> dict[str, Any]:
        mine = capture_rng() if self._pending is None else self._pending
        # Lightning asks every rank for its state; only rank 0 writes the file. Each rank's
        # dropout has drawn other numbers (other batches), so every rank's state is kept.
        states = gather_objects(mine)
        return mine if len(states) == 1 else {PER_RANK: states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict.get(PER_RANK)
        if states is None:  # a one-process run's state: every rank starts from it
            self._pending = dict(state_dict)
            return
        rank, _ = rank_and_world()
        # With as many ranks as the run that saved it each rank continues its own state; with
        # more, the extra ranks take rank 0's (the run cannot be exact then anyway).
        self._pending = dict(states[rank] if rank < len(states) else states[0])


class EpochCheckpoint(ModelCheckpoint):
    """Keeps `epochNNN.ckpt` (1-based epoch numbers, as fairseq's checkpointNNN.pt) of the last N.

    Args:
        dirpath: the checkpoints folder.
        keep: how many to keep (-1 = all).
    """

    def __init__(self, dirpath: str, keep: int):
        super().__init__(
            dirpath=dirpath,
            filename="epoch{epoch1:03d}",
            monitor="epoch",
            mode="max",
            save_top_k=int(keep),
            auto_insert_metric_name=False,
            save_on_train_epoch_end=True,
            enable_version_counter=False,
        )

    def _monitor_candidates(self, trainer: pl.Trainer) -> dict[str, torch.Tensor]:
        candidates = super()._monitor_candidates(trainer)
        candidates["epoch1"] = torch.tensor(trainer.current_epoch + 1)
        return candidates
