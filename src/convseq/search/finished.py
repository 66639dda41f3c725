"""The tensorized beam search's finished hypotheses (`convseq.search.beam`): stored as they end
(`finalise`), then each sentence's ``nbest`` best returned (`best_hypotheses`).

A finished hypothesis is kept as (score, block, row in block): its history is gathered once per
step with finished hypotheses (a "block"), and the per-hypothesis dicts are made at the end for
the ``nbest`` kept only.
"""

from __future__ import annotations

import numpy as np

from convseq.search.buffers import History
from convseq.search.interface import Hypothesis
from convseq.search.run import index_tensor, length_normalise

NEG_INF = float("-inf")


def finalise(
    host: np.ndarray,
    step: int,
    K: int,
    lenpen: float,
    normalize: bool,
    history: History,
    sent_ids: list[int],
    finalized: list[list[tuple[float, int, int]]],
    blocks: list[tuple],
    finished: list[bool],
) -> list[int]:
    """Store the EOS candidates among each sentence's top K; return the positions now complete.

    Args:
        host: (bsz * K,) on the CPU: row r's finished score (its EOS candidate is among the K
            best of its sentence), else -inf.
        lenpen, normalize: the length penalty, applied here in Python floats (as the reference
            search applies it).
        finalized: per input sentence, (score, block, row in block) of each finished hypothesis.
        blocks: the finished histories, one (tokens, lprobs, attention) gather per step.
    """
    hits = np.flatnonzero(host != NEG_INF)  # rows, in order
    if hits.size == 0:
        return []
    # fairseq finalises a sentence's EOS candidates best first (it matters when fewer slots
    # than candidates are left, and for the order of equal final scores)
    ranked = sorted(zip(hits.tolist(), host[hits].tolist()), key=lambda h: (h[0] // K, -h[1]))
    picks = []  # rows finished
    block = len(blocks)
    done = []
    for row, score in ranked:
        b = row // K
        sent = sent_ids[b]
        if finished[sent]:
            continue
        finalized[sent].append(
            (length_normalise(score, step + 1, lenpen, normalize), block, len(picks))
        )
        picks.append(row)
        if len(finalized[sent]) == K:
            finished[sent] = True
            done.append(b)
    if picks:
        blocks.append(history.finished(index_tensor(picks, history.device), step))
    return done


def best_hypotheses(
    finalized: list[list[tuple[float, int, int]]],
    blocks: list[tuple],
    nbest: int,
    src_lens: list[int],
    width: int,
) -> list[list[Hypothesis]]:
    """Each sentence's ``nbest`` best hypotheses, best first, as fairseq's generator returns them."""
    out: list[list[Hypothesis]] = []
    for sent, hyps in enumerate(finalized):
        # stable: equal scores keep the order they were finished in
        best = sorted(hyps, key=lambda h: h[0], reverse=True)[:nbest]
        kept: list[Hypothesis] = []
        for score, block, i in best:
            tokens, lprobs, attention = blocks[block]
            kept.append(
                {
                    "tokens": tokens[i],  # (L,) a view into the step's gather
                    "score": score,
                    "positional_scores": lprobs[i],  # (L,)
                    # (S, L) -> (src_len, L): the left padding removed
                    "attention": None
                    if attention is None
                    else attention[i][width - src_lens[sent] :],
                }
            )
        out.append(kept)
    return out
