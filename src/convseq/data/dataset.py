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

Speed: a DataLoader asks `__getitems__` for a whole batch at once; over memory-mapped token arrays
it gathers every sentence of the batch with one vectorised index (no per-sentence Python objects)
and `collater` pads the result with one masked assignment per tensor. `__getitem__` plus
`collater(list of samples)` give the same batches, one sentence at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from convseq.common.specials import EOS_ID, PAD_ID
from convseq.data.batching import decode_index
from convseq.data.indexed import TokenArray
from convseq.errors import DataError


@dataclass
class RawBatch:
    """Sentences of one batch, concatenated, rows already by decreasing source length."""

    ids: np.ndarray  # (B,) dataset indices
    src: np.ndarray  # (sum S_i,) int64 source ids
    src_lens: np.ndarray  # (B,)
    tgt: np.ndarray | None  # (sum T_i,) int64 target ids
    tgt_lens: np.ndarray | None  # (B,)
    is_dummy: bool


class LanguagePairDataset(Dataset):
    """Pairs (source ids, target ids) read from two token arrays of the same length.

    Indices from a dummy (rank-evening) batch arrive encoded as `-1 - i` (batching.dummy_index):
    `ds[-1]` is pair 0 flagged dummy, not the last pair.

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
        self._init_views()

    def _init_views(self) -> None:
        self.src_sizes = _sizes(self.src)  # (N,) lengths incl. EOS: all the batch sampler needs
        has_tgt = self.tgt is not None
        self.tgt_sizes = _sizes(self.tgt) if has_tgt else np.zeros_like(self.src_sizes)
        # Plain-ndarray views of the memory maps: indexing np.memmap objects costs ~10x more.
        self._flat = {
            side: (arr.tokens.view(np.ndarray), arr.offsets.view(np.ndarray))
            for side, arr in (("src", self.src), ("tgt", self.tgt))
            if isinstance(arr, TokenArray)
        }

    def __len__(self) -> int:
        return len(self.src_sizes)

    def __getitem__(self, index: int) -> dict:
        i, dummy = decode_index(int(index))
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} pairs")
        src = np.asarray(self.src[i], dtype=np.int64)
        tgt = np.asarray(self.tgt[i], dtype=np.int64) if self.tgt is not None else None
        return {"id": i, "source": src, "target": tgt, "dummy": dummy}

    def __getitems__(self, indices: Sequence[int]) -> RawBatch:
        """A whole batch at once (what DataLoader asks for); `collater` pads it."""
        idx = np.asarray(indices, dtype=np.int64)
        if len(idx) == 0:
            raise ValueError("cannot fetch an empty batch")
        dummy = idx < 0
        if dummy.any() and not dummy.all():
            raise ValueError("a batch mixes dummy and real samples; the sampler never does that")
        ids = np.where(dummy, -1 - idx, idx)  # (B,)
        if ids.min() < 0 or ids.max() >= len(self):
            raise IndexError(f"index {int(ids.max())} out of range for {len(self)} pairs")
        ids = ids[np.argsort(-self.src_sizes[ids], kind="stable")]  # decreasing source length
        src, src_lens = self._gather("src", ids)
        tgt, tgt_lens = self._gather("tgt", ids) if self.tgt is not None else (None, None)
        return RawBatch(ids, src, src_lens, tgt, tgt_lens, bool(dummy[0]))

    def _gather(self, side: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(concatenated ids, lengths) of sentences `ids` of one side."""
        if side not in self._flat:
            arr = self.src if side == "src" else self.tgt
            rows = [np.asarray(arr[i], dtype=np.int64) for i in ids.tolist()]
            return np.concatenate(rows), np.array([len(r) for r in rows], dtype=np.int64)
        tokens, offsets = self._flat[side]
        starts = offsets[ids]  # (B,)
        lens = offsets[ids + 1] - starts  # (B,)
        # position of every token: its sentence's start + its rank inside the sentence
        first = np.cumsum(lens) - lens  # (B,) where each sentence begins in the output
        pos = np.arange(int(lens.sum())) + np.repeat(starts - first, lens)  # (sum L_i,)
        return tokens[pos].astype(np.int64), lens

    def collater(self, samples: Sequence[dict] | RawBatch) -> dict:
        """Merge samples (a list from `__getitem__`, or `__getitems__`'s RawBatch) into a batch."""
        return collate(samples, self.pad, self.eos)

    def __getstate__(self) -> dict:
        # Memory maps travel to DataLoader workers as their file prefix, not as copied arrays.
        state = dict(self.__dict__)
        for key in ("_flat", "src_sizes", "tgt_sizes"):
            state.pop(key)
        for side in ("src", "tgt"):
            if isinstance(state[side], TokenArray):
                state[side] = ("TokenArray", state[side].prefix)
        return state

    def __setstate__(self, state: dict) -> None:
        for side in ("src", "tgt"):
            if isinstance(state[side], tuple) and state[side][:1] == ("TokenArray",):
                state[side] = TokenArray(state[side][1])
        self.__dict__.update(state)
        self._init_views()


def _sizes(arr: Any) -> np.ndarray:
    if hasattr(arr, "sizes"):
        return np.asarray(arr.sizes, dtype=np.int64)
    return np.array([len(x) for x in arr], dtype=np.int64)


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


def _raw_from_samples(samples: Sequence[dict]) -> RawBatch:
    if len(samples) == 0:
        raise ValueError("cannot collate an empty batch")
    dummy = [s["dummy"] for s in samples]
    if any(dummy) and not all(dummy):
        raise ValueError("a batch mixes dummy and real samples; the sampler never does that")
    src_lens = np.fromiter((len(s["source"]) for s in samples), np.int64, len(samples))
    order = np.argsort(-src_lens, kind="stable")  # (B,) rows by decreasing source length
    samples = [samples[k] for k in order]
    has_tgt = samples[0]["target"] is not None
    return RawBatch(
        ids=np.fromiter((s["id"] for s in samples), np.int64, len(samples)),
        src=np.concatenate([s["source"] for s in samples]).astype(np.int64, copy=False),
        src_lens=src_lens[order],
        tgt=np.concatenate([s["target"] for s in samples]).astype(np.int64) if has_tgt else None,
        tgt_lens=np.array([len(s["target"]) for s in samples]) if has_tgt else None,
        is_dummy=dummy[0],
    )


def collate(samples: Sequence[dict] | RawBatch, pad: int = PAD_ID, eos: int = EOS_ID) -> dict:
    """Pad and stack samples (a list of `__getitem__` dicts, or a RawBatch) into a batch dict."""
    raw = samples if isinstance(samples, RawBatch) else _raw_from_samples(samples)
    ids, src_lens, is_dummy = raw.ids, raw.src_lens, raw.is_dummy
    b, s_max = len(ids), int(src_lens.max())
    _check_eos(raw.src, src_lens, ids, eos, "source")
    # Vectorised padding: one masked assignment per tensor instead of a Python-level copy per
    # row (a boolean mask is filled row-major, i.e. in concatenation order).
    src = np.full((b, s_max), pad, dtype=np.int64)  # (B, S)
    # left padding: row i's tokens sit in its last src_lens[i] columns
    src[np.arange(s_max) >= s_max - src_lens[:, None]] = raw.src
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
    if raw.tgt is None:
        return batch
    flat, tgt_lens = raw.tgt, raw.tgt_lens  # (sum T_i,), (B,)
    _check_eos(flat, tgt_lens, ids, eos, "target")
    t_max = int(tgt_lens.max())
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
