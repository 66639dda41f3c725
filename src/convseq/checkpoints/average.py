"""Checkpoint averaging, as fairseq's scripts/average_checkpoints.py does it.

`python run.py task=average` (`convseq.tasks.average`) with `ckpts=[a.ckpt,b.ckpt,c.ckpt]` averages the
model parameters of the listed checkpoints; `ckpts=[RUN_DIR] average.last_n=5` those of the
run's last 5 per-epoch checkpoints (`checkpoints/epochNNN.ckpt`, written when the run was
trained with `checkpoint.keep_epochs=N` or `-1`), fairseq's `--num-epoch-checkpoints`.

Each parameter of the result is the element-wise mean over the checkpoints, summed in float64
and rounded once to the parameter's own dtype (fairseq sums in the parameter's dtype, half as
float32); integer tensors are floor-divided as fairseq does. Weight-normalised layers are averaged
through their stored (g, v) pair, as fairseq averages `weight_g` / `weight_v`, not through the
effective weight. The result keeps the first checkpoint's hyperparameters (model settings and
dictionaries), the data settings the inputs were trained on (`convseq.checkpoints.data_record`:
task=generate takes its data from there) and their segmentation, and holds no optimiser or loop
state; checkpoints trained on different data (language pair, segmentation, dictionaries) are
refused, naming both. The result loads with
`ConvSeqModule.load_from_checkpoint(path, weights_only=True)` for evaluation and generation, and
is not a point to resume training from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from convseq.checkpoints.data_record import (
    DATA_HPARAMS,
    data_differences,
    describe,
    segmentation_differs,
    text_record,
    training_data,
)
from convseq.checkpoints.io import (
    TEXT_KEY,
    atomic_torch_save,
    checkpoints_folder,
    load_checkpoint,
)
from convseq.errors import CheckpointError

__all__ = ["average_checkpoints", "average_state_dicts", "last_n_checkpoints"]

EPOCH_FILE = re.compile(r"epoch(\d+)\.ckpt")  # convseq.training.callbacks.EpochCheckpoint's names
AVERAGE_KEY = "convseq_average"  # the averaged checkpoint's record of its sources
DEFAULT_NAME = "averaged.ckpt"


def last_n_checkpoints(path: str | os.PathLike, n: int) -> list[Path]:
    """The `n` per-epoch checkpoints of the highest epochs in a run or checkpoints folder.

    Args:
        path: a run folder (holding `checkpoints/`) or its `checkpoints/` folder.
        n: how many, >= 1.

    Returns:
        Their paths, latest epoch first (fairseq's order).

    Raises:
        CheckpointError: no such folder, or fewer than `n` epochNNN.ckpt files in it.
    """
    if n < 1:
        raise CheckpointError(f"average.last_n={n}: expected a number of checkpoints >= 1")
    path = Path(path)
    folder = checkpoints_folder(path)
    if not folder.is_dir():
        raise CheckpointError(
            f"{path}: average.last_n needs a run folder or its checkpoints folder"
        )
    found = sorted(
        ((int(m.group(1)), p) for p in folder.iterdir() if (m := EPOCH_FILE.fullmatch(p.name))),
        reverse=True,
    )
    if len(found) < n:
        raise CheckpointError(
            f"{folder}: average.last_n={n} needs {n} per-epoch checkpoints (epochNNN.ckpt), found "
            f"{len(found)}; train with checkpoint.keep_epochs={n} (or -1 for all) to keep them"
        )
    return [p for _, p in found[:n]]


def _check_same_model(first: Mapping[str, Any], other: Mapping[str, Any], a: Path, b: Path) -> None:
    """Refuse to average checkpoints of different models or dictionaries."""
    for key in ("model", "src_vocab", "tgt_vocab"):
        if first.get(key) != other.get(key):
            raise CheckpointError(
                f"{b}: its {key} differs from that of {a}; only checkpoints of one model "
                "(same settings and dictionaries) can be averaged"
            )


def check_same_data(first: Mapping[str, Any], other: Mapping[str, Any], a: Path, b: Path) -> None:
    """Refuse to average checkpoints trained on different data (pair, segmentation settings or
    sentencepiece models), naming both checkpoints and what differs."""
    data_a, data_b = training_data(first), training_data(other)
    text_a, text_b = text_record(first), text_record(other)
    if (data_a is None) != (data_b is None):
        recorded, bare = (a, b) if data_a is not None else (b, a)
        raise CheckpointError(
            f"{recorded} records the data it was trained on ({describe(data_a or data_b)}), "
            f"{bare} records none (a fairseq import?): average checkpoints of one training run "
            "or of runs on the same data"
        )
    why = []
    if data_a is not None and data_b is not None:
        why = [f"data.{k}: {va!r} vs {vb!r}" for k, va, vb in data_differences(data_a, data_b)]
    why += [f"the {side} sentencepiece model" for side in segmentation_differs(text_a, text_b)]
    if why:
        raise CheckpointError(
            f"{b} was trained on {describe(data_b, text_b)}, {a} on {describe(data_a, text_a)}, "
            f"with other data settings ({'; '.join(why)}): only checkpoints trained on the same "
            "data can be averaged"
        )


def check_given_data(ckpt: Mapping[str, Any], path: Path, data: Mapping[str, Any]) -> None:
    """Refuse an input whose recorded training data differs from the ``data`` the user gave."""
    recorded = training_data(ckpt)
    if recorded is None:
        return  # nothing recorded to compare (an imported checkpoint)
    why = [f"data.{k}: {va!r} vs {vb!r}" for k, va, vb in data_differences(recorded, data)]
    if why:
        raise CheckpointError(
            f"{path} was trained on {describe(recorded)}, but the data given is "
            f"{describe(data)} ({'; '.join(why)}): leave data out (the checkpoints carry their "
            "own) or give the data they were trained on"
        )


def _state_dict(ckpt: Mapping[str, Any], path: Path) -> Mapping[str, torch.Tensor]:
    sd, hp = ckpt.get("state_dict"), ckpt.get("hyper_parameters")
    if not isinstance(sd, Mapping) or not isinstance(hp, Mapping) or "model" not in hp:
        raise CheckpointError(
            f"{path}: not a convseq training checkpoint (no state_dict and model "
            "hyperparameters); fairseq checkpoints are read by convseq.checkpoints.fairseq instead"
        )
    return sd


def average_state_dicts(
    paths: Sequence[str | os.PathLike], data: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], dict]:
    """Load the checkpoints one at a time and average their `state_dict`s.

    ``data``: the data config the user gave, if any: every input must have been trained on it.

    Returns:
        (the first checkpoint's dict without its state, the averaged state_dict). Keys keep
        the first checkpoint's order.

    Raises:
        CheckpointError: a file is missing or unreadable, holds another model, was trained on
            other data, or has other parameter names or shapes than the first.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise CheckpointError("task=average: no checkpoint given; set ckpts=[a.ckpt,b.ckpt,...]")
    seen: dict[Path, Path] = {}
    for p in paths:
        key = p.resolve()
        if key in seen:
            raise CheckpointError(f"{p}: listed twice in ckpts (as {seen[key]} too)")
        seen[key] = p
    sums: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    first: dict[str, Any] = {}
    for i, path in enumerate(paths):
        ckpt = load_checkpoint(path, weights_only=True)
        sd = _state_dict(ckpt, path)
        if data is not None:
            check_given_data(ckpt, path, data)
        if i == 0:
            first = {k: v for k, v in ckpt.items() if k != "state_dict"}
            dtypes = {name: t.dtype for name, t in sd.items()}
            for name, t in sd.items():
                # float64 sums: the mean of up to thousands of checkpoints rounds once.
                sums[name] = t.double().clone() if t.is_floating_point() else t.clone()
            continue
        _check_same_model(first["hyper_parameters"], ckpt["hyper_parameters"], paths[0], path)
        check_same_data(first, ckpt, paths[0], path)
        if list(sd) != list(sums):
            missing, extra = sorted(set(sums) - set(sd)), sorted(set(sd) - set(sums))
            raise CheckpointError(
                f"{path}: other parameter names than {paths[0]} (missing {missing[:5]}, "
                f"extra {extra[:5]})"
            )
        for name, t in sd.items():
            if t.shape != sums[name].shape:
                raise CheckpointError(
                    f"{path}: {name} has shape {tuple(t.shape)}, {tuple(sums[name].shape)} in "
                    f"{paths[0]}"
                )
            sums[name] += t.double() if t.is_floating_point() else t
        del ckpt, sd
    n = len(paths)
    averaged = {
        k: (s / n).to(dtypes[k]) if dtypes[k].is_floating_point else s // n for k, s in sums.items()
    }
    return first, averaged


def average_checkpoints(
    paths: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    data: Mapping[str, Any] | None = None,
) -> Path:
    """Average the checkpoints' parameters into a new checkpoint file, written atomically.

    Args:
        paths: convseq training checkpoints of one model, trained on the same data.
        output: the file to write.
        data: the data config the user gave (None: not given); every input must match it.

    Returns:
        The path written.
    """
    output = Path(output).absolute()
    if output in {Path(p).absolute() for p in paths}:
        raise CheckpointError(f"{output}: average.output would overwrite one of the inputs")
    first, averaged = average_state_dicts(paths, data)
    out = {
        "state_dict": averaged,
        "hyper_parameters": first["hyper_parameters"],
        "epoch": int(first.get("epoch", 0)),
        "global_step": int(first.get("global_step", 0)),
        AVERAGE_KEY: {"checkpoints": [str(Path(p).absolute()) for p in paths]},
    }
    # what generation needs besides the weights: the data settings and the segmentation
    for key in ("pytorch-lightning_version", DATA_HPARAMS, TEXT_KEY):
        if key in first:
            out[key] = first[key]
    atomic_torch_save(out, output)
    return output
