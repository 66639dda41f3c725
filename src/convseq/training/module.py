"""`ConvSeqModule`: a translation model (any family), its loss, gradient normalisation and training figures.

Loss and gradients follow fairseq. `training_step` returns the loss *summed* over the batch's
target tokens; once an update's micro-batches are all back-propagated, `on_before_optimizer_step`
multiplies the gradients by ``accumulate_grad_batches * world_size / sample_size``, where
sample_size is the number of target tokens (or sentences, ``criterion.normalize=sentences``) of
the whole update summed over micro-batches and DDP ranks. That factor undoes Lightning's division
of each micro-batch loss by accumulate_grad_batches and DDP's averaging over ranks, leaving
sum-of-gradients / total tokens, fairseq's normalisation. Gradient clipping (the Trainer's
``gradient_clip_val``, norm algorithm) comes after it, in `configure_gradient_clipping`, which
also records the gradient norm.

Logged figures (losses in base 2, as fairseq prints them):

- every update (``train/...``): loss, nll_loss, ppl, wps (target tokens/s), ups (updates/s),
  wpb (target tokens per update), bsz (sentences per update), lr, gnorm (before clipping),
  clip (1 if clipped, else 0);
- every epoch (``train_epoch/...``): the same over the epoch, clip as the fraction of clipped
  updates, and time (the epoch's wall time, validation included);
- after each validation (``valid/...``) and test (``test/...``): loss, nll_loss, ppl.

Only plain values are saved as hyperparameters (dicts, lists, strings, numbers; the dictionaries
as lists of symbols), so ``ConvSeqModule.load_from_checkpoint(path)`` works with torch's default
``weights_only=True`` in a fresh process without the data.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytorch_lightning as pl
import torch

from convseq.common.config import plain, typed
from convseq.data.dictionary import Dictionary
from convseq.inference.translator import Translator, translator_of
from convseq.models.family import ModelConfig, build_model, model_config
from convseq.optim.build import build_optimizer
from convseq.optim.config import OptimConfig
from convseq.training.amp import check_loss_scale
from convseq.training.config import CriterionConfig
from convseq.training.criterion import LabelSmoothedCrossEntropy
from convseq.training.metrics import (
    CLIPPED,
    GNORM,
    LOSS,
    NUM_EPOCH_SUMS,
    NUM_SUMS,
    SAMPLE,
    epoch_metrics,
    loss_metrics,
    on_device,
    on_host,
    update_metrics,
)
from convseq.training.module_checkpoint import ModuleCheckpoint
from convseq.training.nonfinite import non_finite_error


class ConvSeqModule(ModuleCheckpoint, pl.LightningModule):
    """A translation model of any family (`convseq.models.family`) trained with label-smoothed
    cross entropy.

    The configs may also come as plain mappings of their keys: the checkpoint's hyperparameters
    hold them so (``load_from_checkpoint`` passes them back), typed here once.

    Args:
        model: the `model` config.
        src_vocab: the source dictionary's symbols (`Dictionary.to_list()`).
        tgt_vocab: the target dictionary's symbols.
        optim: the `optim` config, used by `configure_optimizers` (None: NAG's defaults).
        criterion: the `criterion` config (None: its defaults).
    """

    def __init__(
        self,
        model: ModelConfig | Mapping[str, Any],
        src_vocab: Sequence[str],
        tgt_vocab: Sequence[str],
        optim: OptimConfig | Mapping[str, Any] | None = None,
        criterion: CriterionConfig | Mapping[str, Any] | None = None,
    ):
        super().__init__()
        self.model_cfg = model_config(model)
        self.optim_cfg = typed(OptimConfig, optim, "optim")
        self.criterion_cfg = typed(CriterionConfig, criterion, "criterion")
        # the hyperparameters are plain values (weights_only=True loads them)
        model, optim, criterion = map(plain, (self.model_cfg, self.optim_cfg, self.criterion_cfg))
        src_vocab = [str(s) for s in src_vocab]
        tgt_vocab = [str(s) for s in tgt_vocab]
        # Not sent to loggers: the vocabularies would flood hparams.yaml.
        self.save_hyperparameters(logger=False)
        self.src_dict, self.tgt_dict = (
            Dictionary.from_list(src_vocab),
            Dictionary.from_list(tgt_vocab),
        )
        pad = self.tgt_dict.pad()
        self.model = build_model(self.model_cfg, len(self.src_dict), len(self.tgt_dict), pad)
        self.criterion = LabelSmoothedCrossEntropy.from_config(self.criterion_cfg, pad)

        # Figures of the update being accumulated, of the current epoch, and of the last update.
        self._update_sums = torch.zeros(NUM_SUMS, dtype=torch.float64)
        self._epoch_sums = torch.zeros(NUM_EPOCH_SUMS, dtype=torch.float64)
        self._epoch_updates = 0
        self._epoch_lr = math.nan  # lr the epoch started with
        self._epoch_train_seconds = 0.0  # time spent in updates this epoch (before this process)
        self._epoch_wall_carry = 0.0  # epoch wall time before this process (resumed mid-epoch)
        self._total_carry = 0.0  # training wall time of earlier processes (resumed runs)
        self._command_carry = 0.0  # their command wall time (start-up included)
        # monotonic time this command started (`convseq.common.clock.command_start`, set by
        # train()); the module's creation where nobody set it
        self.command_started = time.monotonic()
        self._gnorm = torch.zeros(())
        self._last_update = torch.zeros(NUM_SUMS, dtype=torch.float64)
        self._clipped = torch.zeros(())
        self._t_update = self._t_epoch = self._t_fit = time.perf_counter()
        self._valid_sums = torch.zeros(NUM_SUMS, dtype=torch.float64)
        # Per-epoch records (1-based epoch, lr, train and valid figures, seconds), checkpointed.
        self.history: list[dict[str, float]] = []
        self.validations: list[dict[str, float]] = []
        self.valid_epoch: int | None = None  # Lightning epoch (0-based) of the last validation
        self.valid_loss: float | None = None
        self.test_figures: dict[str, float] = {}
        # Extra validation figures set by callbacks before on_validation_epoch_end (valid/bleu).
        self.valid_extra: dict[str, float] = {}
        # The training data's segmentation (convseq.data.subword.text_processing), kept in checkpoints
        # so that raw text can be translated from the checkpoint alone.
        self.text_processing: dict | None = None
        self._last_batch: dict | None = None
        self._skipped = False  # this update overflowed in fp16 and the loss scaler skipped it
        self.skipped_updates = 0  # such updates so far (Lightning's global_step counts them)
        # the last update's figures, logged at the end of its batch on logging steps only
        self._pending_log: tuple | None = None

    # -- model ----------------------------------------------------------------------------------
    def forward(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        prev_output_tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher-forced (B, T, V) logits and attention (every family's ``forward``)."""
        return self.model(src_tokens, src_lengths, prev_output_tokens)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return build_optimizer(self.model.parameters(), self.optim_cfg)

    def _batch_sums(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's summed loss (with graph) and its float64 [sample, ntok, nsent, loss, nll]."""
        logits, _ = self.model(**batch["net_input"])  # (B, T, V)
        out = self.criterion(logits, batch["target"])
        size = self.criterion.sample_size(out)
        row = [size, out.ntokens, out.nsentences, out.loss.detach(), out.nll_loss.detach()]
        dev = out.loss.device
        sums = torch.stack([on_device(v, dev) for v in row])  # (5,) float64
        if batch.get("is_dummy", False):
            # A rank-evening repeat of real sentences: keeps DDP's collectives in step, counts 0.
            return out.loss * 0.0, torch.zeros_like(sums)
        return out.loss, sums

    @property
    def updates(self) -> int:
        """Optimizer updates made: Lightning's steps less those the fp16 loss scaler skipped."""
        return int(self.global_step) - self.skipped_updates

    # -- training -------------------------------------------------------------------------------
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self._last_batch = batch  # a reference only: re-run to name the module if a NaN appears
        loss, sums = self._batch_sums(batch)
        if self._update_sums.device != sums.device:
            self._update_sums = self._update_sums.to(sums.device)
        self._update_sums += sums
        return loss  # summed over tokens; the gradients are normalised before the step

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the accumulated gradients by the update's sample size (all ranks)."""
        sums = self._update_sums
        if self.trainer.world_size > 1:
            sums = self.trainer.strategy.reduce(sums.clone(), reduce_op="sum")
        self._update_sums = torch.zeros_like(sums)
        self._last_update = sums
        size = sums[SAMPLE]  # () tokens (or sentences) of the whole update, all ranks
        factor = self.trainer.accumulate_grad_batches * self.trainer.world_size
        # 0 when the whole update held no target token (only possible with dummy batches).
        scale = torch.where(size > 0, factor / size.clamp(min=1.0), torch.zeros_like(size))
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, scale.to(grads[0].dtype))

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip the (normalised) gradient norm to `gradient_clip_val` and record the norm."""
        if gradient_clip_algorithm not in (None, "norm"):
            raise ValueError(f"convseq clips by norm only, got {gradient_clip_algorithm!r}")
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        clip = float(gradient_clip_val or 0.0)
        # The norm first, then the check, then clipping (what clip_grad_norm_ does in one call):
        # a failing update's gradients stay as they were, so the bad parameters can be named.
        gnorm = torch.nn.utils.get_total_norm([p.grad for p in params])
        loss = self._last_update[LOSS].to(gnorm.device)
        # One host sync per update, as fairseq's own check (gradient norm and loss together).
        gnorm_ok, loss_ok = torch.isfinite(torch.stack([gnorm.double(), loss])).tolist()
        self._skipped = False
        if not gnorm_ok and getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            # 16-mixed: an overflow; the GradScaler skips this step and lowers its scale.
            self._skipped = True
            self._gnorm = torch.zeros((), dtype=torch.float64, device=gnorm.device)
            self._clipped = torch.zeros_like(self._gnorm)
            return
        if not (gnorm_ok and loss_ok):
            raise non_finite_error(self, gnorm, loss, gnorm_ok)
        if clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, clip, gnorm)
        self._gnorm = gnorm.detach().double()
        self._clipped = (gnorm > clip).double() if clip > 0 else torch.zeros_like(self._gnorm)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure=None):
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        now = time.perf_counter()
        seconds, self._t_update = now - self._t_update, now
        self._epoch_train_seconds += seconds
        if self._skipped:  # the loss scaler skipped it: not an update (fairseq does not count it)
            self._skipped = False
            self.skipped_updates += 1
            check_loss_scale(self.trainer.precision_plugin.scaler, self.updates)
            return
        sums = self._last_update
        if self._epoch_sums.device != sums.device:
            self._epoch_sums = self._epoch_sums.to(sums.device)
        self._epoch_sums[:NUM_SUMS] += sums
        self._epoch_sums[GNORM] += self._gnorm
        self._epoch_sums[CLIPPED] += self._clipped
        self._epoch_updates += 1
        lr = optimizer.param_groups[0]["lr"]
        self._pending_log = (sums, seconds, lr, self._gnorm, self._clipped)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Log the update's figures on the updates Lightning writes to the loggers only.

        Logged on every update, the progress bar's figures were read back from the device
        (`.item()`) and the Python numbers copied to it at every batch, whatever
        log_every_n_steps: host syncs a GPU pays for. Here, after the callbacks (a stop they
        asked for makes this a logging step too), with Lightning's own test.
        """
        pending, self._pending_log = self._pending_log, None
        if pending is None:  # a micro-batch of an accumulated update, or a skipped update
            return
        trainer = self.trainer
        if trainer._logger_connector.should_update_logs or trainer.fast_dev_run:
            self._log_update(*pending)

    def _log_update(
        self, sums: torch.Tensor, seconds: float, lr: float, gnorm: torch.Tensor, clipped: Any
    ) -> None:
        """Per-update figures (Lightning writes them to loggers every log_every_n_steps)."""
        shown, others = update_metrics(sums, seconds, lr, gnorm, clipped)
        host = on_host({**shown, **others})  # one copy; the bar's per-batch reads are free
        # batch_size only silences Lightning's guess: per-step values are not averaged.
        self.log_dict(
            {k: host[k] for k in shown}, on_step=True, on_epoch=False, prog_bar=True, batch_size=1
        )
        self.log_dict({k: host[k] for k in others}, on_step=True, on_epoch=False, batch_size=1)

    def on_train_start(self) -> None:
        now = time.perf_counter()
        self._t_fit = self._t_update = self._t_epoch = now

    def on_train_epoch_start(self) -> None:
        self._epoch_sums = torch.zeros_like(self._epoch_sums)
        self._epoch_updates = 0
        self._epoch_train_seconds = 0.0
        self._epoch_wall_carry = 0.0
        self._t_epoch = self._t_update = time.perf_counter()
        self._epoch_lr = float(self.trainer.optimizers[0].param_groups[0]["lr"])

    def on_train_epoch_end(self) -> None:
        wall = self._epoch_wall_carry + time.perf_counter() - self._t_epoch
        record = epoch_metrics(
            self._epoch_sums.tolist(),
            self._epoch_updates,
            self._epoch_train_seconds,
            wall,
            self._epoch_lr,
        )
        self.log_dict(record, on_step=False, on_epoch=True, batch_size=1)
        entry = {"epoch": self.current_epoch + 1, "updates": self.updates, **record}
        if self.valid_epoch == self.current_epoch and self.valid_loss is not None:
            entry.update(self._valid_record)
        self.history.append(entry)

    # -- evaluation -----------------------------------------------------------------------------
    def _eval_step(self, batch: dict) -> None:
        if batch.get("is_dummy", False):
            return  # a repeat that evens out ranks: never counted
        _, sums = self._batch_sums(batch)
        if self._valid_sums.device != sums.device:
            self._valid_sums = self._valid_sums.to(sums.device)
        self._valid_sums += sums

    def _eval_figures(self, prefix: str) -> dict[str, float]:
        sums = self._valid_sums
        if self.trainer.world_size > 1:
            sums = self.trainer.strategy.reduce(sums.clone(), reduce_op="sum")
        return loss_metrics(sums.tolist(), prefix)

    def on_validation_epoch_start(self) -> None:
        self._valid_sums = torch.zeros(NUM_SUMS, dtype=torch.float64, device=self.device)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step(batch)

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:
            return
        record = self._eval_figures("valid")
        record.update(self.valid_extra)
        self.valid_extra = {}
        self.log_dict(record, prog_bar=True, batch_size=1)
        self.valid_epoch = self.current_epoch
        self.valid_loss = record["valid/loss"]
        self._valid_record = record
        # every validation, also those inside an epoch (validate_interval_updates)
        optimizers = self.trainer.optimizers
        lr = float(optimizers[0].param_groups[0]["lr"]) if optimizers else None  # its updates' lr
        minutes = self.command_seconds() / 60.0  # since the command started (time to quality)
        self.validations.append(
            {
                "epoch": self.current_epoch + 1,
                "updates": self.updates,
                "lr": lr,
                "minutes": minutes,
                **record,
            }
        )

    def on_test_epoch_start(self) -> None:
        self._valid_sums = torch.zeros(NUM_SUMS, dtype=torch.float64, device=self.device)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step(batch)

    def on_test_epoch_end(self) -> None:
        self.test_figures = self._eval_figures("test")
        self.log_dict(self.test_figures, batch_size=1)

    # -- generation -----------------------------------------------------------------------------
    def predict_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> list[dict]:
        """Per sentence of the batch: its id and n-best hypotheses (tokens, detokenised text,
        scores, alignment), searched with `translator().options` (see `convseq.inference.translator`).
        Sort trainer.predict's output with `convseq.inference.records.in_input_order`."""
        return self.translator().translate_batch(batch)

    def translator(self) -> Translator:
        """This model as a `convseq.inference.translator.Translator` (its `options` set the search)."""
        return translator_of(self)

    def translate(self, sentences: str | Sequence[str], **options: Any) -> str | list:
        """Translate raw text (see `Translator.translate`): ``translate(["..."], beam=5)``."""
        return self.translator().translate(sentences, **options)
