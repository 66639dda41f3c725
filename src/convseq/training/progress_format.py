"""How a job-log record reads: one line of text (`format_record`) or one JSON object.

`convseq.training.progress.ProgressLines` makes the records; this module only writes them out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["format_record", "json_number", "plain_value"]


def _clock(seconds: float) -> str:
    """`0:01:02` (hours grow past 24: `27:00:00`)."""
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _num(x: Any) -> str:
    """A figure at a precision that reads well: 4 significant digits, big numbers whole."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return str(x)
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 1000:
        return f"{x:.0f}"
    return f"{x:.4g}"


def _epochs(record: Mapping[str, Any]) -> str:
    """`epochs 2`, or with a partial last epoch `epochs 1 and update 37/250 of epoch 2`."""
    text = f"epochs {record['epochs']}"
    if record.get("epoch_update"):
        of = f"/{record['epoch_updates']}" if record.get("epoch_updates") else ""
        text += f" and update {record['epoch_update']}{of} of epoch {record['epochs'] + 1}"
    return text


def format_record(record: Mapping[str, Any]) -> str:
    """The text line of a record (see the module docstring)."""
    kind = record["kind"]
    if kind == "update":
        of = f"/{record['epoch_updates']}" if record.get("epoch_updates") else ""
        parts = [
            f"epoch {record['epoch']}",
            f"update {record['epoch_update']}{of} ({record['updates']})",
        ]
        names = {"nll_loss": "nll"}
        for key in ("loss", "nll_loss", "ppl", "lr", "gnorm", "wps", "ups"):
            if key in record:
                parts.append(f"{names.get(key, key)} {_num(record[key])}")
        parts.append(f"elapsed {_clock(record['elapsed'])}")
        if record.get("epoch_eta") is not None:
            parts.append(f"epoch eta {_clock(record['epoch_eta'])}")
        return " | ".join(parts)
    if kind == "valid":
        parts = [f"epoch {record['epoch']}", f"valid (update {record['updates']})"]
        for key, name in (("loss", "loss"), ("nll_loss", "nll"), ("ppl", "ppl"), ("bleu", "bleu")):
            if key in record:
                parts.append(f"{name} {_num(record[key])}")
        if record.get("best") is not None:
            parts.append(f"best {record['best_metric']} {_num(record['best'])}")
        if record.get("patience_left") is not None:
            parts.append(f"patience {record['patience_left']} left")
        if record.get("lr") is not None:
            parts.append(f"lr {_num(record['lr'])}")
        return " | ".join(parts)
    if kind == "checkpoint":
        return f"epoch {record['epoch']} | update {record['updates']} | saved {record['path']}"
    if kind == "stop":
        return (
            f"stopped: {record['reason']} | {_epochs(record)} | updates "
            f"{record['updates']} | elapsed {_clock(record['elapsed'])}"
        )
    raise ValueError(f"unknown progress record kind {kind!r}")


def plain_value(value: Any) -> Any:
    """A logged value as a Python number (tensors were already read when they were logged)."""
    if isinstance(value, torch.Tensor):
        return value.item()
    return value


def json_number(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x
