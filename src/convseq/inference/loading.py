"""Loading models for translation: convseq or fairseq checkpoints, and the segmentation they carry.

convseq checkpoints hold the segmentation of their training data under `TEXT_KEY` (languages and
the serialized sentencepiece models, or None for whitespace tokens), so that raw text can be
translated from the checkpoint alone, without the data-bin.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from convseq.checkpoints.fairseq import load_fairseq
from convseq.checkpoints.io import BEST, CHECKPOINT_DIR, LAST
from convseq.data.dictionary import Dictionary
from convseq.data.subword import Segmenter
from convseq.errors import CheckpointError
from convseq.models.fconv import FConvModel

TEXT_KEY = "convseq_text"  # a checkpoint's segmentation entry (see `text_processing`)
MODEL_PREFIX = "model."  # the LightningModule's name for the FConvModel in its state dict


# ---------------------------------------------------------------------------- segmentation


def text_processing(src_lang: str, tgt_lang: str, src: Segmenter, tgt: Segmenter) -> dict:
    """A checkpoint's segmentation entry: languages and serialized sentencepiece models (or None).

    Plain values and bytes only, so checkpoints stay loadable with ``weights_only=True``.
    """

    def proto(seg: Segmenter) -> bytes | None:
        return None if seg.model is None else bytes(seg.model.serialized_model_proto())

    return {
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
        "src_spm": proto(src),
        "tgt_spm": proto(tgt),
    }


def databin_text_processing(databin: Any) -> dict:
    """`text_processing` of a `convseq.data.databin.DataBin`."""
    return text_processing(
        databin.src_lang, databin.tgt_lang, databin.segmenter("src"), databin.segmenter("tgt")
    )


def segmenters(info: Mapping[str, Any] | None) -> tuple[Segmenter, Segmenter]:
    """(source, target) segmenters of a `text_processing` entry; whitespace when absent."""

    def load(proto: bytes | None) -> Segmenter:
        if proto is None:
            return Segmenter(None)
        import sentencepiece as spm

        return Segmenter(spm.SentencePieceProcessor(model_proto=proto))

    info = info or {}
    return load(info.get("src_spm")), load(info.get("tgt_spm"))


# ---------------------------------------------------------------------------- checkpoints


@dataclass
class LoadedModel:
    """A model read from a checkpoint, with its dictionaries and segmentation entry."""

    model: nn.Module
    src_dict: Dictionary
    tgt_dict: Dictionary
    text: dict | None  # `text_processing` entry, None when the checkpoint has none


def load_any(
    path: str | os.PathLike, dict_dir: str | os.PathLike | None = None, map_location: Any = "cpu"
) -> LoadedModel:
    """Read a convseq checkpoint (a run folder: its best.ckpt) or a fairseq fconv checkpoint.

    Both are read with ``weights_only=True`` (fairseq's through convseq.checkpoints.safe_load's allowlist);
    nothing in the file runs.
    """
    path = Path(path)
    if path.is_dir():
        for name in (BEST, LAST):
            if (path / CHECKPOINT_DIR / name).is_file():
                path = path / CHECKPOINT_DIR / name
                break
        else:
            raise CheckpointError(
                f"{path}: a folder without {CHECKPOINT_DIR}/{BEST} or {CHECKPOINT_DIR}/{LAST}; "
                "pass a checkpoint file or a run folder"
            )
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


def build_model(
    model_cfg: Mapping[str, Any], src_vocab: Sequence[str], tgt_vocab: Sequence[str]
) -> tuple[FConvModel, Dictionary, Dictionary]:
    """A fresh FConvModel and its dictionaries from plain hyperparameters (the model config and
    the dictionaries' symbol lists), as checkpoints store them; `ConvSeqModule` builds its own
    model with it too.

    Raises:
        CheckpointError: the two dictionaries disagree on the pad symbol.
    """
    src_vocab, tgt_vocab = [str(s) for s in src_vocab], [str(s) for s in tgt_vocab]
    src_dict, tgt_dict = Dictionary.from_list(src_vocab), Dictionary.from_list(tgt_vocab)
    pad = tgt_dict.pad()
    if src_dict.pad() != pad:
        raise CheckpointError("source and target dictionaries disagree on the pad symbol")
    model = FConvModel.build(dict(model_cfg), len(src_vocab), len(tgt_vocab), padding_idx=pad)
    return model, src_dict, tgt_dict


def model_from_checkpoint(ckpt: Mapping[str, Any], path: str | os.PathLike) -> LoadedModel:
    """The model of a convseq training checkpoint (a `ConvSeqModule`'s), in eval mode.

    Built from the checkpoint's plain hyperparameters (model config and vocabularies) as the
    LightningModule builds it; its weights are the state dict's ``model.*`` entries, loaded
    strictly, so a checkpoint that does not match the model it describes is refused.

    Raises:
        CheckpointError: the hyperparameters or weights do not describe an fconv model.
    """
    hp = ckpt["hyper_parameters"]
    try:
        model, src_dict, tgt_dict = build_model(hp["model"], hp["src_vocab"], hp["tgt_vocab"])
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
    return LoadedModel(model, src_dict, tgt_dict, ckpt.get(TEXT_KEY))
