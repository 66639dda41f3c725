"""Reduced precision as fairseq users know it.

``trainer.precision=16-mixed`` is fairseq's ``--fp16``: fp16 autocast with a dynamic loss scale
that starts at ``amp.init_scale`` (fairseq's ``--fp16-init-scale``, 128), halves on every
overflow and doubles after ``amp.scale_window`` updates without one (``--fp16-scale-window``;
by default fairseq's 2**14 / data-parallel processes / accumulated batches). An update whose
gradients overflowed is skipped and not counted: `ConvSeqModule` leaves it out of the update
count (`max_update`, the summary) and of the epoch's figures, as fairseq does. When the scale
falls below ``amp.min_scale`` (``--min-loss-scale``) training stops with an error.

``trainer.precision=bf16-mixed`` needs a device with bfloat16 arithmetic; on a CUDA device of
compute capability below 8.0 (e.g. a P40, 6.1; a V100, 7.0), and on a CPU without AVX-512 BF16,
it is refused with a message.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from pytorch_lightning.plugins.precision import MixedPrecision

from convseq.common.config import TrainerConfig
from convseq.errors import NonFiniteError
from convseq.inference.precision import PrecisionError, cpu_has, device_type
from convseq.training.config import AmpConfig

FP16 = ("16-mixed", "16")
log = logging.getLogger(__name__)
BF16 = ("bf16-mixed", "bf16")


class LossScaler(torch.amp.GradScaler):
    """torch's GradScaler with fairseq's factors (x2 / x0.5) and a floor (`min_scale`)."""

    def __init__(self, device: str, init_scale: float, scale_window: int, min_scale: float):
        super().__init__(
            device,
            init_scale=float(init_scale),
            growth_factor=2.0,
            backoff_factor=0.5,
            growth_interval=int(scale_window),
        )
        self.min_scale = float(min_scale)


def process_count(trainer: TrainerConfig) -> int:
    """Data-parallel processes of ``trainer``: devices per node (a count, ids or auto) x nodes."""
    devices = trainer.devices
    if isinstance(devices, (list, tuple)):
        count = len(devices)
    elif str(devices) in ("auto", "-1"):
        count = max(torch.cuda.device_count(), 1)
    else:
        count = int(devices)
    return max(count, 1) * max(trainer.num_nodes, 1)


def scale_window(amp: AmpConfig, trainer: TrainerConfig) -> int:
    """``amp.scale_window``, or fairseq's default 2**14 / processes / accumulated batches."""
    window = amp.scale_window
    if window is None:
        accumulate = max(trainer.accumulate_grad_batches, 1)
        window = 2**14 // process_count(trainer) // accumulate
    if int(window) < 1:
        raise PrecisionError(f"amp.scale_window={window}: give a number of updates >= 1")
    return int(window)


def cuda_devices(trainer: TrainerConfig) -> list[tuple[int, str, tuple[int, int]]]:
    """(index, name, compute capability) of the CUDA devices `trainer` trains on; [] on the
    CPU or without CUDA (Lightning reports a missing GPU itself)."""
    if device_type(trainer.accelerator) == "cpu" or not torch.cuda.is_available():
        return []
    devices = trainer.devices
    ids = list(devices) if isinstance(devices, (list, tuple)) else range(torch.cuda.device_count())
    return [(i, torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i)) for i in ids]


def warn_fp16(trainer: TrainerConfig) -> list[str]:
    """16-mixed below compute capability 7.0 (a P40, 6.1): no fp16 tensor cores, so fp16 buys
    no speed there and adds loss scaling and its skipped updates. Logs the advice (fp32) once per
    such device and returns the messages."""
    if str(trainer.precision) not in FP16:
        return []
    messages = [
        f"trainer.precision={trainer.precision} on {name} (compute capability "
        f"{major}.{minor}): below 7.0 a GPU has no fp16 tensor cores, so fp16 is not faster than "
        "fp32 there and adds loss scaling (skipped updates); trainer.precision=32-true is the "
        "choice on this card"
        for _, name, (major, minor) in cuda_devices(trainer)
        if (major, minor) < (7, 0)
    ]
    for message in messages:
        log.warning(message)
    return messages


def check_bf16(trainer: TrainerConfig) -> None:
    """Refuse bf16 where it has no arithmetic: CUDA devices of compute capability < 8.0, and
    CPUs without AVX-512 BF16 (there bf16 is emulated, slower than fp32)."""
    if str(trainer.precision) not in BF16:
        return
    if device_type(trainer.accelerator) == "cpu":
        if not cpu_has("bf16"):
            raise PrecisionError(
                f"trainer.precision={trainer.precision} on the CPU needs AVX-512 BF16 "
                "instructions, which this CPU lacks (bf16 would be emulated, slower than fp32); "
                "use trainer.precision=32-true here, or bf16-mixed on a CPU that has them "
                "(e.g. AMD Zen 4, Intel Cooper Lake / Sapphire Rapids) or an Ampere+ GPU"
            )
        return
    for _, name, (major, minor) in cuda_devices(trainer):
        if (major, minor) < (8, 0):
            raise PrecisionError(
                f"trainer.precision={trainer.precision}: {name} (compute capability "
                f"{major}.{minor}) has no bfloat16 arithmetic (it needs 8.0, Ampere or newer); "
                "use trainer.precision=16-mixed (fp16 with loss scaling, fairseq's --fp16) or "
                "trainer.precision=32-true"
            )


def precision_plugins(trainer: TrainerConfig, amp: AmpConfig) -> tuple[str | None, list[Any]]:
    """(the ``precision`` to give the Trainer, or None; plugins to add) for ``trainer``.

    16-mixed becomes a `MixedPrecision` plugin with a `LossScaler` from ``amp``; other
    precisions go to the Trainer as they are, after `check_bf16`.
    """
    precision = trainer.precision
    check_bf16(trainer)
    warn_fp16(trainer)
    if str(precision) not in FP16:
        return precision, []
    init_scale, min_scale = float(amp.init_scale), float(amp.min_scale)
    if not 0 < min_scale <= init_scale:
        raise PrecisionError(
            f"amp.min_scale={min_scale} and amp.init_scale={init_scale}: need "
            "0 < min_scale <= init_scale"
        )
    device = device_type(trainer.accelerator)
    scaler = LossScaler(device, init_scale, scale_window(amp, trainer), min_scale)
    return None, [MixedPrecision("16-mixed", device, scaler)]


def check_loss_scale(scaler: Any, updates: int) -> None:
    """After a skipped update: stop when the loss scale fell below the scaler's floor.

    Read only after an overflow (the value lives on the device: reading it every update would
    make the host wait for the device).

    Raises:
        NonFiniteError: the scale is below `LossScaler.min_scale`.
    """
    floor = getattr(scaler, "min_scale", None)
    if floor is None:
        return
    scale = float(scaler.get_scale())
    if scale < floor:
        raise NonFiniteError(
            f"the fp16 loss scale fell to {scale:g}, below amp.min_scale={floor:g}, after "
            f"{updates} updates: the loss is probably exploding. Lower optim.lr, set "
            "optim.clip_norm, use larger batches, or train with trainer.precision=bf16-mixed "
            "or 32-true; then resume from the last checkpoint (resume=true)"
        )
