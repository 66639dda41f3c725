"""Greedy decoding over the full (non-incremental) decoder forward: an independent check of beam 1.

At every step the decoder reruns over the whole prefix (no incremental state, no reordering, no
candidate bookkeeping) and each unfinished sentence takes its most probable next token, under the
same masking rules as the beam search (pad never, unk penalty, EOS forbidden before ``min_len``
and forced at the sentence's maximum length). Slow on purpose: quadratic in the output length.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from convseq.search.interface import Hypothesis
from convseq.search.run import SearchBatch, SearchSettings, length_normalise, run_search

NEG_INF = float("-inf")


def greedy(
    model: Any,
    src_tokens: torch.Tensor,
    src_lengths: torch.Tensor,
    lenpen: float = 1.0,
    unk_penalty: float = 0.0,
    min_len: int = 1,
    max_len_a: float = 0,
    max_len_b: int = 200,
    normalize_scores: bool = True,
    need_attn: bool = True,
) -> list[list[Hypothesis]]:
    """Argmax decoding; returns one hypothesis per sentence in `beam_search`'s format."""
    # the plain model: no folded weights, no per-sentence attention products
    settings = SearchSettings(
        1, lenpen, unk_penalty, min_len, max_len_a, max_len_b, 1, normalize_scores, False, False,
        need_attn,
    )  # fmt: skip
    return run_search(partial(_greedy, settings=settings), model, src_tokens, src_lengths, settings)


def _greedy(batch: SearchBatch, settings: SearchSettings) -> list[list[Hypothesis]]:
    m, src_tokens, src_lengths = batch.model, batch.src_tokens, batch.src_lengths
    src_lens, limits = batch.src_lens, batch.limits
    unk_penalty, min_len = settings.unk_penalty, settings.min_len
    lenpen, normalize_scores = settings.lenpen, settings.normalize_scores
    bsz, width = src_tokens.shape
    device = src_tokens.device
    limits_t = torch.tensor(limits, device=device)  # (B,)
    encoder_out = m.encode(src_tokens, src_lengths)
    prev = torch.full((bsz, 1), m.eos, dtype=torch.long, device=device)  # (B, t+1)
    picked_lprobs, attns = [], []
    done = torch.zeros(bsz, dtype=torch.bool, device=device)  # (B,)
    ends = torch.full((bsz,), -1, dtype=torch.long, device=device)  # step of each EOS
    for step in range(max(limits) + 1):
        lprobs, attn = m.decode(prev, encoder_out, None)  # full forward: (B, V), (B, S)
        lprobs = lprobs.clone()
        lprobs[:, m.pad] = NEG_INF
        lprobs[:, m.unk] -= unk_penalty
        if step < min_len:
            lprobs[:, m.eos] = NEG_INF
        at_limit = limits_t.le(step)  # (B,)
        eos_lp = lprobs[:, m.eos].clone()
        # masked_fill, not lprobs[at_limit]: boolean indexing counts the rows on the host
        lprobs.masked_fill_(at_limit.unsqueeze(1), NEG_INF)
        lprobs[:, m.eos] = torch.where(at_limit, eos_lp, lprobs[:, m.eos])
        token = lprobs.argmax(dim=1)  # (B,)
        picked_lprobs.append(lprobs.gather(1, token.unsqueeze(1)))  # (B, 1)
        if attn is not None:
            attns.append(attn)
        ends = torch.where(~done & token.eq(m.eos), torch.full_like(ends, step), ends)
        done |= token.eq(m.eos)
        prev = torch.cat([prev, token.unsqueeze(1)], dim=1)
        # the step's one host read: stopping when all are done saves the quadratic forward
        if bool(done.all()):
            break

    out = []
    lps = torch.cat(picked_lprobs, dim=1)  # (B, steps)
    lengths = [end + 1 for end in ends.tolist()]
    # each row's sum over its own slice (the same reduction as one sum per row), read at once
    sums = torch.stack([lps[i, :n].sum() for i, n in enumerate(lengths)]).tolist()
    for i, length in enumerate(lengths):
        positional = lps[i, :length]
        attention = None
        if attns:
            attention = torch.stack(attns[:length], dim=2)[i, width - src_lens[i] :]  # (src, L)
        out.append(
            [
                {
                    "tokens": prev[i, 1 : length + 1],
                    "score": length_normalise(sums[i], length, lenpen, normalize_scores),
                    "positional_scores": positional,
                    "attention": attention,
                }
            ]
        )
    return out
