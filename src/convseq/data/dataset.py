"""Sentence pairs and their collation into padded batches, with fairseq's conventions.

A batch (the dict `collater` returns; B sentences, S / T longest source / target, EOS included):

    id                  (B,)   dataset index of each row (put outputs back in input order with it)
    nsentences          int    B, or 0 for a dummy batch
    ntokens             int    non-pad target tokens (EOS included), or 0 for a dummy batch
    net_input
      src_tokens        (B, S) source ids, LEFT-padded with pad=1, each ending with EOS
      src_lengths       (B,)   source lengths, EOS included
      prev_output_tokens (B, T) decoder input: EOS, then the target without its EOS; right-padded
    target              (B, T) target ids ending with EOS, right-padded
    is_dummy            bool   a rank-evening batch (see batching.py): its loss must be multiplied
                               by 0 and it must never reach metrics or outputs

Rows are sorted by decreasing source length, as fairseq's collater does (ties keep their order).
A dataset without targets (translation of raw input) gives `target` and `prev_output_tokens` None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from convseq.data.batching import decode_index
from convseq.data.indexed import TokenArray
from convseq.errors import DataError

PAD_ID = 1
EOS_ID = 2


def _check_eos(flat: np.ndarray, lens: np.ndarray, ids: np.ndarray, eos: int, side: str) -> None:
    """Raise DataError unless every sentence is non-empty and ends with EOS (one vector op)."""
    ok = lens >= 1
    if ok.all():
        ok = flat[np.cumsum(lens) - 1] == eos
    if not ok.all():
        i = int(ids[np.flatnonzero(~ok)[0]])
        raise DataError(
            f"{side} sentence {i} is empty or does not end with EOS (id {eos}); every binarised "
            "sentence must: delete the data-bin and re-run preprocessing"
        )


class LanguagePairDataset(Dataset):
    """Pairs (source ids, target ids) read from two token arrays of the same length.

    Args:
        src: source sentences (a `TokenArray` or any sequence of id arrays ending with EOS).
        tgt: target sentences, or None (source only).
        pad: padding id. eos: end-of-sentence id.
    """

    def __init__(self, src: Any, tgt: Any | None = None, *, pad: int = PAD_ID, eos: int = EOS_ID):
        if tgt is not None and len(src) != len(tgt):
            raise DataError(
                f"source has {len(src)} sentences but target has {len(tgt)}; the data-bin is "
                "damaged: delete it and re-run preprocessing",
                path=getattr(src, "prefix", None),
            )
        self.src, self.tgt = src, tgt
        self.pad, self.eos = pad, eos
        self.src_sizes = _sizes(src)  # (N,) lengths incl. EOS: all the batch sampler needs
        self.tgt_sizes = _sizes(tgt) if tgt is not None else np.zeros_like(self.src_sizes)

    def __len__(self) -> int:
        return len(self.src_sizes)

    def __getitem__(self, index: int) -> dict:
        i, dummy = decode_index(int(index))
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} pairs")
        src = np.asarray(self.src[i], dtype=np.int64)
        tgt = np.asarray(self.tgt[i], dtype=np.int64) if self.tgt is not None else None
        return {"id": i, "source": src, "target": tgt, "dummy": dummy}

    def collater(self, samples: Sequence[dict]) -> dict:
        """Merge samples into one padded batch (layout in the module docstring)."""
        return collate(samples, self.pad, self.eos)

    def __getstate__(self) -> dict:
        # Memory maps travel to DataLoader workers as their file prefix, not as copied arrays.
        state = dict(self.__dict__)
        for side in ("src", "tgt"):
            if isinstance(state[side], TokenArray):
                state[side] = ("TokenArray", state[side].prefix)
                state[f"{side}_sizes"] = None  # recomputed from the offsets on arrival
        return state

    def __setstate__(self, state: dict) -> None:
        for side in ("src", "tgt"):
            if isinstance(state[side], tuple) and state[side][:1] == ("TokenArray",):
                state[side] = TokenArray(state[side][1])
                state[f"{side}_sizes"] = _sizes(state[side])
        self.__dict__.update(state)


def _sizes(arr: Any) -> np.ndarray:
    if hasattr(arr, "sizes"):
        return np.asarray(arr.sizes, dtype=np.int64)
    return np.array([len(x) for x in arr], dtype=np.int64)


def collate(samples: Sequence[dict], pad: int = PAD_ID, eos: int = EOS_ID) -> dict:
    """Pad and stack samples (dicts from `LanguagePairDataset.__getitem__`) into a batch dict."""
    if len(samples) == 0:
        raise ValueError("cannot collate an empty batch")
    dummy = [s["dummy"] for s in samples]
    if any(dummy) and not all(dummy):
        raise ValueError("a batch mixes dummy and real samples; the sampler never does that")
    is_dummy = dummy[0]
    src_lens = np.fromiter((len(s["source"]) for s in samples), np.int64, len(samples))
    order = np.argsort(-src_lens, kind="stable")  # (B,) rows by decreasing source length
    samples = [samples[k] for k in order]
    src_lens = src_lens[order]
    ids = np.fromiter((s["id"] for s in samples), np.int64, len(samples))
    b, s_max = len(samples), int(src_lens.max())

    # Vectorised padding: one concatenate and one masked assignment per tensor, instead of a
    # Python-level copy per row (the mask is filled row-major, i.e. in concatenation order).
    flat = np.concatenate([s["source"] for s in samples])  # (sum S_i,)
    _check_eos(flat, src_lens, ids, eos, "source")
    src = np.full((b, s_max), pad, dtype=np.int64)  # (B, S)
    # left padding: row i's tokens sit in its last src_lens[i] columns
    src[np.arange(s_max) >= s_max - src_lens[:, None]] = flat
    batch: dict[str, Any] = {
        "id": torch.from_numpy(ids),
        "nsentences": 0 if is_dummy else b,
        "ntokens": 0,
        "net_input": {
            "src_tokens": torch.from_numpy(src),
            "src_lengths": torch.from_numpy(src_lens),
            "prev_output_tokens": None,
        },
        "target": None,
        "is_dummy": is_dummy,
    }
    if samples[0]["target"] is None:
        return batch
    tgt_lens = np.fromiter((len(s["target"]) for s in samples), np.int64, b)
    t_max = int(tgt_lens.max())
    flat = np.concatenate([s["target"] for s in samples])  # (sum T_i,)
    _check_eos(flat, tgt_lens, ids, eos, "target")
    mask = np.arange(t_max) < tgt_lens[:, None]  # (B, T) right padding
    target = np.full((b, t_max), pad, dtype=np.int64)  # (B, T)
    target[mask] = flat
    # Decoder input: each target shifted right by one with EOS in front. Rolling the flat array
    # by one puts the previous sentence's final EOS first; the starts are set explicitly anyway.
    shifted = np.roll(flat, 1)
    shifted[np.cumsum(tgt_lens) - tgt_lens] = eos
    prev = np.full((b, t_max), pad, dtype=np.int64)  # (B, T)
    prev[mask] = shifted
    batch["target"] = torch.from_numpy(target)
    batch["net_input"]["prev_output_tokens"] = torch.from_numpy(prev)
    batch["ntokens"] = 0 if is_dummy else int(tgt_lens.sum())
    return batch
