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
from convseq.models.fconv import FConvModel

MODEL_PREFIX = "model."  # the LightningModule's name for the FConvModel in its state dict


@dataclass
class LoadedModel:
    """A model read from a checkpoint, with its dictionaries, segmentation and training data."""

    model: nn.Module
    src_dict: Dictionary
    tgt_dict: Dictionary
    text: dict | None  # `convseq.data.subword.text_processing` entry, None when none is stored
    data: dict | None = None  # the plain data config it was trained on; None: not recorded


def load_any(
    path: str | os.PathLike, dict_dir: str | os.PathLike | None = None, map_location: Any = "cpu"
) -> LoadedModel:
    """Read a convseq checkpoint (a run folder, or its checkpoints folder: its best.ckpt, else
    its last.ckpt) or a fairseq fconv checkpoint.

    Both are read with ``weights_only=True`` (fairseq's through convseq.checkpoints.safe_load's allowlist);
    nothing in the file runs.
    """
    path = Path(path)
    if path.is_dir():
        found = find_checkpoint(path, [BEST, LAST])
        if found is None:
            raise CheckpointError(
                f"{path}: a folder without {CHECKPOINT_DIR}/{BEST} or {CHECKPOINT_DIR}/{LAST}; "
                "pass a checkpoint file or a run folder"
            )
        path = found
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
    LightningModule builds it (`FConvModel.build` over the dictionaries' sizes); its weights are the state dict's ``model.*`` entries, loaded
    strictly, so a checkpoint that does not match the model it describes is refused.

    Raises:
        CheckpointError: the hyperparameters or weights do not describe an fconv model.
    """
    hp = ckpt["hyper_parameters"]
    try:
        src_dict, tgt_dict = (
            Dictionary.from_list(hp["src_vocab"]),
            Dictionary.from_list(hp["tgt_vocab"]),
        )
        model = FConvModel.build(hp["model"], len(src_dict), len(tgt_dict), tgt_dict.pad())
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
