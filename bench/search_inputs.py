"""Models and sources for bench/bench_search.py: a random preset, or a trained checkpoint on real text.

A random model has no natural output length, so the benchmark stops each sentence by its own limit
and biases EOS (see bench_search's docstring). A trained model (``--ckpt``, e.g. the Multi30k
recipe's ``best.ckpt``) translating real sentences (``--src-file``, e.g. ``test.de``) stops where
its translations end, which gives the output lengths, finishing steps and batch shrinking that
generation really sees.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from convseq.models.family import preset_config
from convseq.models.fconv import FConvModel

CONF = Path(__file__).resolve().parents[1] / "conf" / "model"
PAD, EOS = 1, 2


def random_model(arch: str, vocab: int, eos_bias: float, device: str) -> FConvModel:
    """The preset ``arch`` (conf/model) with random weights and ``vocab`` words on each side."""
    cfg = preset_config(CONF / f"{arch}.yaml")
    model = FConvModel.build(cfg, vocab, vocab).to(device).eval()
    with torch.no_grad():
        model.decoder.fc3.bias[EOS] += eos_bias
    return model


def random_sources(n: int, lens: tuple[int, int], vocab: int, seed: int) -> list[np.ndarray]:
    """``n`` sources of random words, lengths uniform in ``lens`` (EOS included), shortest first."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lens[0], lens[1] + 1, (n,), generator=gen).sort().values
    out = []
    for length in lengths.tolist():
        ids = torch.randint(4, vocab, (length,), generator=gen)
        ids[-1] = EOS
        out.append(ids.numpy())
    return out


def trained_model(ckpt: str, device: str):
    """(model, translator) of a convseq or fairseq checkpoint; the translator encodes text."""
    from convseq.inference.translator import Translator

    translator = Translator.from_checkpoints(ckpt).to(device)
    return translator.models[0].eval(), translator


def file_sources(path: str, translator, n: int) -> list[np.ndarray]:
    """The first ``n`` lines of ``path``, segmented and numbered as the checkpoint's data was."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    if len(lines) < n:
        raise SystemExit(f"{path}: {len(lines)} lines, fewer than the {n} sentences asked for")
    return [translator.encode(line)[0].astype(np.int64) for line in lines[:n]]


def make_batches(
    sources: list[np.ndarray], batch: int, device: str
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The sources in length order (as fairseq batches them), left-padded, ``batch`` at a time."""
    ordered = sorted(sources, key=len)  # stable
    out = []
    for start in range(0, len(ordered), batch):
        chunk = ordered[start : start + batch]
        width = max(len(s) for s in chunk)
        src = torch.full((len(chunk), width), PAD)  # (B, S)
        for i, ids in enumerate(chunk):
            src[i, width - len(ids) :] = torch.from_numpy(ids)
        lengths = torch.tensor([len(s) for s in chunk])  # (B,)
        out.append((src.to(device), lengths.to(device)))
    return out
