"""Loading models for translation: convseq or fairseq checkpoints, and the segmentation they carry.

convseq checkpoints hold the segmentation of their training data under
`convseq.checkpoints.io.TEXT_KEY` (languages and the serialized sentencepiece models, or None for
whitespace tokens: `convseq.data.subword.text_processing`), so that raw text can be translated
from the checkpoint alone, without the data-bin, and the ``data`` config they were trained on
(`convseq.checkpoints.data_record`), so that a split is translated from the right corpus.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from convseq.checkpoints.data_record import training_data
from convseq.checkpoints.fairseq import load_fairseq
from convseq.checkpoints.io import BEST, CHECKPOINT_DIR, LAST, TEXT_KEY, find_checkpoint
from convseq.data.dictionary import Dictionary
from convseq.errors import CheckpointError
from convseq.models.family import build_model

MODEL_PREFIX = "model."  # the LightningModule's name for its model in its state dict
FOLDER_ORDER = (BEST, LAST)  # what ckpt=<run folder> reads: the first of these that is there


@dataclass
class LoadedModel:
    """A model read from a checkpoint, with its dictionaries, segmentation and training data."""

    model: nn.Module
    src_dict: Dictionary
    tgt_dict: Dictionary
    text: dict | None  # `convseq.data.subword.text_processing` entry, None when none is stored
    data: dict | None = None  # the plain data config it was trained on; None: not recorded


def folder_checkpoint(folder: str | os.PathLike) -> Path:
    """The file `load_any` reads for a run folder or its checkpoints folder: its best.ckpt,
    else its last.ckpt (`folder_choice` says which, and why).

    Raises:
        CheckpointError: the folder holds neither.
    """
    found = find_checkpoint(folder, FOLDER_ORDER)
    if found is None:
        raise CheckpointError(
            f"{folder}: a folder without {CHECKPOINT_DIR}/{BEST} or {CHECKPOINT_DIR}/{LAST}; "
            "pass a checkpoint file or a run folder"
        )
    return found


def load_any(
    path: str | os.PathLike, dict_dir: str | os.PathLike | None = None, map_location: Any = "cpu"
) -> LoadedModel:
    """Read a convseq checkpoint (a run folder, or its checkpoints folder: its best.ckpt, else
    its last.ckpt) or a fairseq fconv or LightConv checkpoint.

    Both are read with ``weights_only=True`` (fairseq's through convseq.checkpoints.safe_load's allowlist);
    nothing in the file runs.
    """
    path = Path(path)
    if path.is_dir():
        path = folder_checkpoint(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        ckpt = None  # fairseq's Namespace / OmegaConf globals: read through the interop below
    except Exception as e:  # the weights-only unpickler runs no code: any error is a bad file
        raise CheckpointError(
            f"{path}: not a readable checkpoint ({type(e).__name__}: {e}); it may be truncated"
        ) from e
    if isinstance(ckpt, dict) and "hyper_parameters" in ckpt and "state_dict" in ckpt:
        return model_from_checkpoint(ckpt, path)
    model, src_dict, tgt_dict = load_fairseq(path, dict_dir)
    model.to(map_location if isinstance(map_location, (str, torch.device)) else "cpu")
    return LoadedModel(model, src_dict, tgt_dict, None)


def model_from_checkpoint(ckpt: Mapping[str, Any], path: str | os.PathLike) -> LoadedModel:
    """The model of a convseq training checkpoint (a `ConvSeqModule`'s), in eval mode.

    Built from the checkpoint's plain hyperparameters (model config and vocabularies) as the
    LightningModule builds it (`convseq.models.family.build_model` over the dictionaries' sizes); its weights are the state dict's ``model.*`` entries, loaded
    strictly, so a checkpoint that does not match the model it describes is refused.

    Raises:
        CheckpointError: the hyperparameters or weights do not describe a model of a known family.
    """
    hp = ckpt["hyper_parameters"]
    try:
        src_dict, tgt_dict = (
            Dictionary.from_list(hp["src_vocab"]),
            Dictionary.from_list(hp["tgt_vocab"]),
        )
        model = build_model(hp["model"], len(src_dict), len(tgt_dict), tgt_dict.pad())
        weights = {
            name[len(MODEL_PREFIX) :]: value
            for name, value in ckpt["state_dict"].items()
            if name.startswith(MODEL_PREFIX)
        }
        others = sorted(n for n in ckpt["state_dict"] if not n.startswith(MODEL_PREFIX))
        if others:
            raise CheckpointError(f"unexpected weights {others[:3]} beside the model's")
        model.load_state_dict(weights, strict=True)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"{path}: not a convseq model checkpoint ({type(e).__name__}: {e}); convseq "
            "checkpoints come from task=train or task=import_fairseq"
        ) from e
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from e
    model.eval()
    return LoadedModel(model, src_dict, tgt_dict, ckpt.get(TEXT_KEY), training_data(ckpt))


# ---------------------------------------------------------------------------- ckpt=<run folder>


@dataclass(frozen=True)
class SavedAt:
    """Where a training checkpoint was saved, from Lightning's own entries in it."""

    updates: int
    epoch: int  # 1-based: the epoch it was saved in (mid-epoch) or at the end of
    mid_epoch: bool
    monitor: str | None = None  # the best checkpoint's figure and its value, where recorded
    best: float | None = None

    def when(self) -> str:
        """``update 6, in the middle of epoch 1`` or ``update 54, at the end of epoch 3``."""
        where = "in the middle" if self.mid_epoch else "at the end"
        return f"update {self.updates}, {where} of epoch {self.epoch}"


def saved_at(path: str | os.PathLike) -> SavedAt | None:
    """Where the training checkpoint `path` was saved; None for any other file (read
    memory-mapped: the weights are not read)."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        progress = ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]
        at = SavedAt(
            int(ckpt["global_step"]), int(ckpt["epoch"]) + 1, not progress["is_last_batch"]
        )
    except Exception:  # not a training checkpoint, or unreadable: load_any says which
        return None
    states = ckpt.get("callbacks")
    for state in states.values() if isinstance(states, Mapping) else ():
        # the checkpoint callback writing best.ckpt keeps its figure and best value
        if isinstance(state, Mapping) and Path(str(state.get("best_model_path"))).name == BEST:
            score = state.get("best_model_score")
            if score is not None and state.get("monitor"):
                return SavedAt(at.updates, at.epoch, at.mid_epoch, state["monitor"], float(score))
    return at


def folder_choice(path: str | os.PathLike) -> str | None:
    """For ``ckpt=`` a run folder (or its checkpoints folder): the line that says which file
    `load_any` reads there and why. None for a file (it names itself) or a folder with neither.

    E.g. ``ckpt=outputs/run: using checkpoints/last.ckpt, saved at update 6, in the middle of
    epoch 1, where the run was interrupted; no best.ckpt: the run had not validated yet``; for
    best.ckpt, its figure and value, and a later last.ckpt where there is one.
    """
    folder = Path(path)
    found = find_checkpoint(folder, FOLDER_ORDER) if folder.is_dir() else None
    if found is None:
        return None
    head = f"ckpt={path}: using {found.relative_to(folder)}"
    at = saved_at(found)
    if at is None:
        return head
    if found.name == LAST:
        if at.mid_epoch:
            return (
                f"{head}, saved at {at.when()}, where the run was interrupted; no {BEST}: the "
                "run had not validated yet"
            )
        return f"{head}, saved at {at.when()}; no {BEST}: no validation recorded a best"
    what = f"the best {at.monitor} ({at.best:.4f}) of the run's validations, " if at.monitor else ""
    line = f"{head}, {what}saved at {at.when()}"
    last = found.with_name(LAST)
    later = saved_at(last) if last.is_file() else None
    if later is not None and later.updates > at.updates:
        line += f"; {last.relative_to(folder)} is later ({later.when()}): ckpt={last} uses it"
    return line
