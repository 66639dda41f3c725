"""convseq's DDP strategy: Lightning's `DDPStrategy` without two collectives of every update.

Lightning's training epoch loop broadcasts a SIGTERM flag from rank 0 before every batch when
more than one rank runs (`_TrainingEpochLoop._broadcast_sigterm_tensor`): a tensor made on the
training device, a blocking collective, then `.item()`, which on a GPU waits for every queued
kernel, once per batch. convseq agrees on signals itself: `SignalCallback` takes SIGTERM and
SIGINT over from Lightning when training starts and all-reduces a CPU flag over a gloo group at
every update, from whichever rank received the signal (Lightning's broadcast only ever carries
rank 0's). After that point Lightning's own flag cannot be raised, so its broadcast carries
nothing.

The second: Lightning's `reduce` (the all-reduce of every update's loss and token sums,
`ConvSeqModule.on_before_optimizer_step`) puts a barrier before the all-reduce. The all-reduce
waits for every rank by itself; a barrier on NCCL also makes the host wait until the device is
idle. Sums are all-reduced here without it; other reductions are Lightning's.

Two DDP settings are chosen from the model rather than left at PyTorch's defaults: buffers are
not broadcast before every forward pass (`forward_sync_buffers=False`: the only buffers of both
model families are constants -- version markers, LightConv's sinusoid table -- which DDP makes
equal on every rank when it starts, so the broadcast was one collective a step for nothing), and `find_unused_parameters` is turned on only where a parameter gets no
gradient (`convseq.training.unused_params`, checked once at setup). A value the user gives
(`ddp_find_unused_parameters_true/false`) is kept; `false` with unused parameters is refused
at setup, naming them, instead of failing at the second step.

What remains of Lightning's broadcast is its first one in each `fit`: a signal that came before
convseq's handler was installed (during setup or the sanity check) was caught by Lightning's
handler, and that broadcast spreads it as Lightning does. `trainer.strategy=ddp` (and Lightning's
`ddp_find_unused_parameters_*` names) build this strategy (`convseq.training.build`); other
strategies are Lightning's own.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop
from pytorch_lightning.strategies import DDPStrategy

from convseq.errors import SettingError
from convseq.training.header import log_header
from convseq.training.unused_params import unused_parameters

__all__ = ["DDP_NAMES", "ConvSeqDDPStrategy", "strategy_argument"]


# Lightning's registered names of DDPStrategy launched by re-running the command line, and the
# arguments each stands for.
DDP_NAMES: dict[str, dict[str, Any]] = {
    "ddp": {},
    "ddp_find_unused_parameters_false": {"find_unused_parameters": False},
    "ddp_find_unused_parameters_true": {"find_unused_parameters": True},
}


class _EpochLoopSharingTheSignalOnce(_TrainingEpochLoop):
    """Lightning's training epoch loop, broadcasting its SIGTERM flag at the first batch only."""

    share_signal: bool = True  # set again by the strategy when each fit starts

    def _broadcast_sigterm_tensor(self) -> None:
        if self.share_signal:
            self.share_signal = False
            super()._broadcast_sigterm_tensor()


class ConvSeqDDPStrategy(DDPStrategy):
    """`DDPStrategy` whose training loop leaves signal agreement to convseq's `SignalCallback`."""

    _loop: _TrainingEpochLoop | None = None

    def __init__(self, **kwargs: Any) -> None:
        if "broadcast_buffers" not in kwargs:  # torch's older name for it, where a user gives it
            kwargs.setdefault("forward_sync_buffers", False)  # constant buffers: synced at init
        super().__init__(**kwargs)

    def configure_ddp(self) -> None:
        """Wrap the model in DDP, told about parameters that get no gradient."""
        model = getattr(self.lightning_module, "model", None)
        unused = unused_parameters(model) if isinstance(model, torch.nn.Module) else None
        chosen = self._ddp_kwargs.get("find_unused_parameters")
        if unused and chosen is False:
            raise SettingError(
                f"trainer.strategy=ddp_find_unused_parameters_false: {len(unused)} parameters "
                f"get no gradient in this model ({', '.join(unused[:3])}, ...): use "
                "trainer.strategy=ddp, which handles them"
            )
        if unused and chosen is None:
            self._ddp_kwargs["find_unused_parameters"] = True
            if self.global_rank == 0:
                names = ", ".join(unused[:3])
                log_header(
                    [
                        f"DDP: {len(unused)} parameters get no gradient ({names}, ...): "
                        "find_unused_parameters on"
                    ]
                )
        super().configure_ddp()

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        loop = trainer.fit_loop.epoch_loop
        # A plain Lightning loop only: a loop a user installed keeps its own behaviour. The
        # class is swapped rather than the loop rebuilt: the loop already holds the data
        # sources and settings that fit() attached to it.
        if type(loop) is _TrainingEpochLoop:
            loop.__class__ = _EpochLoopSharingTheSignalOnce
            self._loop = loop

    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any = "mean") -> Any:
        """A sum is all-reduced without the barrier Lightning's `reduce` puts before it."""
        summing = isinstance(reduce_op, str) and reduce_op.lower() == "sum"
        if not (summing and isinstance(tensor, torch.Tensor) and dist.is_initialized()):
            return super().reduce(tensor, group=group, reduce_op=reduce_op)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        return tensor

    def on_train_start(self) -> None:
        super().on_train_start()
        if isinstance(self._loop, _EpochLoopSharingTheSignalOnce):
            self._loop.share_signal = True


def strategy_argument(name: Any) -> Any:
    """What the Trainer gets for `trainer.strategy`: convseq's DDP strategy for Lightning's
    DDP names (see `DDP_NAMES`), anything else unchanged."""
    if isinstance(name, str) and name in DDP_NAMES:
        return ConvSeqDDPStrategy(**DDP_NAMES[name])
    return name
