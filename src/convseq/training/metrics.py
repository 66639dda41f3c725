"""The training metrics: fairseq's loss, nll_loss and ppl (base 2) from float64 sums.

`ConvSeqModule` keeps, per update and per epoch, the sums laid out below (summed over
micro-batches and DDP ranks before any division), and turns them into logged metrics here
(numbers only: the plots are in `convseq.viz`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

LN2 = math.log(2.0)

# Layout of the float64 sums kept per update and per epoch.
SAMPLE, NTOKENS, NSENT, LOSS, NLL = range(5)
NUM_SUMS = 5
# Per epoch, two more: the sum of gradient norms and the number of clipped updates.
GNORM, CLIPPED = 5, 6
NUM_EPOCH_SUMS = 7


def loss_metrics(sums: Sequence[float], prefix: str) -> dict[str, float]:
    """fairseq's loss, nll_loss (bits per token) and ppl from [sample_size, ntokens, ...] sums."""
    size, ntok = float(sums[SAMPLE]), float(sums[NTOKENS])
    loss = float(sums[LOSS]) / size / LN2 if size > 0 else math.nan
    nll = float(sums[NLL]) / ntok / LN2 if ntok > 0 else math.nan
    ppl = nll if math.isnan(nll) else (2.0**nll if nll < 1024 else math.inf)
    return {f"{prefix}/loss": loss, f"{prefix}/nll_loss": nll, f"{prefix}/ppl": ppl}


def epoch_metrics(
    sums: Sequence[float], updates: int, train_seconds: float, wall: float, lr: float
) -> dict[str, float]:
    """An epoch's ``train_epoch/...`` metrics from its float64 sums (`NUM_EPOCH_SUMS` of them).

    Args:
        sums: [sample_size, ntokens, nsentences, loss, nll, gnorm sum, clipped updates].
        updates: optimizer steps in the epoch.
        train_seconds: time spent in updates (wps and ups are per second of it).
        wall: the epoch's wall time, validation included.
        lr: the lr the epoch started with.
    """
    n = max(updates, 1)
    seconds = max(train_seconds, 1e-9)
    record = loss_metrics(sums, "train_epoch")
    record.update(
        {
            "train_epoch/wps": sums[NTOKENS] / seconds,
            "train_epoch/ups": updates / seconds,
            "train_epoch/wpb": sums[NTOKENS] / n,
            "train_epoch/bsz": sums[NSENT] / n,
            "train_epoch/gnorm": sums[GNORM] / n,
            "train_epoch/clip": sums[CLIPPED] / n,
            "train_epoch/lr": lr,
            "train_epoch/time": wall,
        }
    )
    return record


def on_device(value: torch.Tensor | float, device: torch.device) -> torch.Tensor:
    """A () float64 tensor on `device` of a tensor or a Python number, without a host sync.

    Why: ``torch.as_tensor(number, device=cuda)`` copies the number from host memory, and that
    copy waits for the device's queue; ``torch.full`` hands it to a fill kernel instead.
    """
    if isinstance(value, torch.Tensor):
        return value.to(torch.float64)
    return torch.full((), float(value), dtype=torch.float64, device=device)


def update_metrics(
    sums: torch.Tensor, seconds: float, lr: float, gnorm: torch.Tensor, clipped: torch.Tensor
) -> tuple[dict[str, Any], dict[str, Any]]:
    """An update's ``train/...`` metrics from its (5,) sums: (progress-bar ones, the others).

    Tensors stay tensors: Lightning reads them only when it writes the logs.
    """
    size, ntok = sums[SAMPLE].clamp(min=1.0), sums[NTOKENS].clamp(min=1.0)
    loss = sums[LOSS] / size / LN2
    nll = sums[NLL] / ntok / LN2
    seconds = max(seconds, 1e-9)
    shown = {"train/loss": loss.float(), "train/ppl": torch.pow(2.0, nll).float()}
    others = {
        "train/nll_loss": nll.float(),
        "train/wps": (sums[NTOKENS] / seconds).float(),
        "train/ups": 1.0 / seconds,
        "train/wpb": sums[NTOKENS].float(),
        "train/bsz": sums[NSENT].float(),
        "train/lr": float(lr),
        "train/gnorm": gnorm.float(),
        "train/clip": clipped.float(),
    }
    return shown, others


def on_host(figures: dict[str, Any]) -> dict[str, torch.Tensor]:
    """`figures` (device tensors and Python numbers) as () float32 tensors in host memory, with
    one device-to-host copy for all of them.

    Why: Lightning reads every progress-bar value back with ``.item()`` at each batch end, the
    last logged ones too, until they are logged again; values in host memory make those reads
    free, where device values would make the host wait for the device's queue at every batch.
    Logged as CPU tensors they stay there (Lightning keeps a logged value on its device), and
    Python numbers are not copied to the device first.
    """
    names = [k for k, v in figures.items() if isinstance(v, torch.Tensor)]
    out: dict[str, torch.Tensor] = {}
    if names:
        stacked = torch.stack([figures[k].detach().float().reshape(()) for k in names])  # (n,)
        host = stacked.cpu()  # the one copy (and host sync) of a logging step
        out = dict(zip(names, host.unbind(0)))
    for k, v in figures.items():
        if k not in out:
            out[k] = torch.tensor(float(v), dtype=torch.float32)  # made in host memory
    return {k: out[k] for k in figures}
