"""Loading models for translation: convseq or fairseq checkpoints, and the segmentation they carry.

convseq checkpoints hold the segmentation of their training data under `TEXT_KEY` (languages and
the serialized sentencepiece models, or None for whitespace tokens), so that raw text can be
translated from the checkpoint alone, without the data-bin.
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

from convseq.checkpoint import BEST, CHECKPOINT_DIR, LAST
from convseq.data.dictionary import Dictionary
from convseq.data.subword import Segmenter
from convseq.errors import CheckpointError

TEXT_KEY = "convseq_text"  # a checkpoint's segmentation entry (see `text_processing`)


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

    Both are read with ``weights_only=True`` (fairseq's through convseq.interop's allowlist);
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
        from convseq.module import ConvSeqModule

        module = ConvSeqModule(**ckpt["hyper_parameters"])
        module.on_load_checkpoint(ckpt)
        module.load_state_dict(ckpt["state_dict"], strict=True)
        module.eval()
        return LoadedModel(
            module.model, module.src_dict, module.tgt_dict, getattr(module, "text_processing", None)
        )
    from convseq.interop import load_fairseq

    model, src_dict, tgt_dict = load_fairseq(path, dict_dir)
    model.to(map_location if isinstance(map_location, (str, torch.device)) else "cpu")
    return LoadedModel(model, src_dict, tgt_dict, None)
