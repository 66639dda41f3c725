"""The tensorized beam search: fairseq's SequenceGenerator semantics, hypotheses chosen by tensor ops.

Every step runs one batched incremental decoder call over ``bsz * beam`` rows and scores the last
position only. Each hypothesis' EOS candidate is set apart, so that one ``topk`` over ``beam x
vocab`` per sentence gives the ``beam`` best continuations, which are fairseq's active hypotheses;
an EOS candidate finishes its hypothesis when it ranks among the ``beam`` best candidates of its
sentence (one small ``topk`` over continuations and EOS candidates). The host reads one
``(bsz, beam)`` tensor per step, the finished scores, and loops only over finished hypotheses,
whose histories come from one gather per tensor; a sentence with ``beam`` finished hypotheses
leaves the batch, the decoder state and the encoder output.

No other step waits for the device: the host's index lists (finished rows, kept sentences) are
queued to it from pinned memory (`index_tensor`), and the decoder is told that hypotheses stay
within their sentence's beam (`block_reorder`), so that it keeps its cached encoder output
without comparing copies on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from convseq.modules.reorder import block_reorder
from convseq.search.buffers import History
from convseq.search.finished import best_hypotheses, finalise
from convseq.search.interface import Hypothesis
from convseq.search.run import SearchBatch, SearchSettings, index_tensor, run_search
from convseq.search.timing import SearchTimer, phase_of

NEG_INF = float("-inf")
POS_INF = float("inf")


def beam_search(
    model: Any,
    src_tokens: torch.Tensor,
    src_lengths: torch.Tensor,
    beam: int = 5,
    lenpen: float = 1.0,
    unk_penalty: float = 0.0,
    min_len: int = 1,
    max_len_a: float = 0,
    max_len_b: int = 200,
    nbest: int = 1,
    normalize_scores: bool = True,
    *,
    timer: SearchTimer | None = None,
    shrink: bool = True,
    fold_weight_norm: bool = True,
    beamable_mm: bool = True,
    need_attn: bool = True,
) -> list[list[Hypothesis]]:
    """Translate a batch with beam search.

    Args:
        model: an FConvModel or a LightConvModel, any model with fairseq's incremental-decoder
            interface, or a `SearchModel` (e.g. an ensemble, of either family or both).
        src_tokens: (B, S) left-padded source, each row ending in EOS.
        src_lengths: (B,) source lengths, EOS included.
        beam: hypotheses kept per sentence (not capped at the vocabulary size).
        lenpen: finished scores are divided by ``length ** lenpen`` (EOS counted).
        unk_penalty: subtracted from the unknown word's log-prob.
        min_len: EOS is forbidden at the first ``min_len`` steps.
        max_len_a, max_len_b: EOS is forced once ``int(a * src_len + b)`` tokens were
            produced, src_len being the sentence's own length; capped by the model's positions.
        nbest: hypotheses returned per sentence.
        normalize_scores: apply the length penalty; False keeps the plain log-prob sum.
        timer: optional hook called around each phase (see `convseq.search.timing.PHASES`).
        shrink: remove finished sentences from the batch (off only for measurements).
        fold_weight_norm: fold weight norm into plain weights for the run (fconv's; a
            LightConv model has no weight norm: nothing to fold, no effect).
        beamable_mm: compute single-step attention products once per sentence (fconv's
            attention; LightConv's multi-head attention has no such path: no effect).
        need_attn: return the attention (False skips averaging it).

    Returns:
        Per input sentence, in input order, its ``nbest`` best hypotheses, best first.
    """
    settings = SearchSettings(
        beam, lenpen, unk_penalty, min_len, max_len_a, max_len_b, nbest, normalize_scores,
        fold_weight_norm, beamable_mm, need_attn,
    )  # fmt: skip
    search = partial(_search, settings=settings, timer=timer, shrink=shrink)
    return run_search(search, model, src_tokens, src_lengths, settings)


def _search(
    batch: SearchBatch, settings: SearchSettings, timer: SearchTimer | None, shrink: bool
) -> list[list[Hypothesis]]:
    """One batch's search: per step, decode, score the candidates, select the next beams,
    finalise the hypotheses that end, and reorder the state for the beams kept."""
    m, s = batch.model, settings
    phase = phase_of(timer)
    K, bsz, device = s.beam, batch.src_tokens.size(0), batch.src_tokens.device
    with phase("encoder"):
        encoder_out = m.encode(batch.src_tokens, batch.src_lengths)
        expand = torch.arange(bsz, device=device).repeat_interleave(K)  # (bsz*K,) 0,0,..,1,1,..
        encoder_out = m.reorder_encoder_out(encoder_out, expand)
    beams = _start(batch, K, encoder_out)

    for step in range(max(batch.limits) + 1):
        with phase("decoder"):
            tokens = beams.history.tokens(beams.bsz * K, step)  # (rows, step + 1)
            lprobs, step_attn = m.decode(tokens, beams.encoder_out, beams.state)
        if step_attn is not None:
            with phase("reorder"):  # history bookkeeping
                beams.history.store_attention(step_attn, step)  # (rows, S)

        with phase("candidates"):
            act_scores, act_idx, eos_lprobs, at_limit = _candidates(lprobs, step, beams, s)

        with phase("selection"):
            parents, new_tokens, new_lprobs, host = _select(
                act_scores, act_idx, lprobs, eos_lprobs, beams.cum,
                beams.row_offsets[: beams.bsz], lprobs.size(1), K,
                step >= s.min_len,  # before min_len no EOS can finish: nothing to read
            )  # fmt: skip
            beams.cum = act_scores  # (bsz, K)

        newly_finished: list[int] = []  # batch positions
        if host is not None:
            with phase("finalisation"):
                newly_finished = _finish_sentences(host, at_limit, step, beams, s)
            beams.remaining -= len(newly_finished)
        if beams.remaining == 0:
            break

        with phase("reorder"):
            _reorder(beams, parents, new_tokens, new_lprobs, newly_finished, shrink, step)
    with phase("finalisation"):
        width = batch.src_tokens.size(1)
        return best_hypotheses(beams.finalized, beams.blocks, s.nbest, batch.src_lens, width)


@dataclass
class _Beams:
    """A batch's search state between steps: the sentences still in the batch, their
    hypotheses (cumulative scores, history, decoder state) and the finished ones."""

    model: Any  # the SearchModel
    K: int  # the beam
    limits: list[int]  # per input sentence, its last step
    encoder_out: Any  # K copies per sentence still in the batch
    history: History
    cum: torch.Tensor  # (rows,) cumulative log-prob of each hypothesis; (bsz, K) after selection
    row_offsets: torch.Tensor  # (bsz, 1) first row of each sentence
    bsz: int  # sentences still in the batch
    sent_ids: list[int]  # batch position -> input sentence
    min_limit: int  # the smallest last step of the sentences still in the batch
    # per sentence, its finished hypotheses as (score, block, row in block), in finishing order;
    # the dicts are built at the end for the nbest kept only (most finished ones are dropped)
    finalized: list[list[tuple[float, int, int]]]
    finished: list[bool]  # per input sentence
    remaining: int  # sentences not finished
    state: dict = field(default_factory=dict)  # the decoder's incremental state
    blocks: list[tuple] = field(default_factory=list)  # per step with finished hypotheses:
    # (tokens, lprobs, attention)
    total_buf: torch.Tensor | None = None  # (bsz*K, V) scores of every continuation, reused


def _start(batch: SearchBatch, K: int, encoder_out: Any) -> _Beams:
    """The state before the first step: every sentence in the batch with one live beam.

    ``encoder_out`` holds K copies of each sentence's encoder output.
    """
    m, limits = batch.model, batch.limits
    device = batch.src_tokens.device
    bsz = batch.src_tokens.size(0)
    history = History(bsz * K, max(limits) + 1, m.eos, device)
    # all beams of a sentence start identical: only beam 0 is live at step 0 (the others score
    # -inf, which also covers vocabularies smaller than the beam)
    cum = torch.zeros(bsz, K, device=device)
    cum[:, 1:] = NEG_INF
    cum = cum.view(-1)  # (rows,) cumulative log-prob of each hypothesis
    row_offsets = torch.arange(bsz, device=device).unsqueeze(1) * K  # (bsz, 1) first row of each
    return _Beams(
        m, K, limits, encoder_out, history, cum, row_offsets, bsz,
        sent_ids=list(range(bsz)), min_limit=min(limits),
        finalized=[[] for _ in range(bsz)], finished=[False] * bsz, remaining=bsz,
    )  # fmt: skip


def _candidates(
    lprobs: torch.Tensor, step: int, beams: _Beams, s: SearchSettings
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Mask the step's log-probs in place and rank each sentence's continuations.

    Returns:
        the K best continuations of each sentence, (bsz, K) scores and indices into
        beam x vocab; the EOS log-probs set apart (rows,); the batch positions whose sentence
        must end now.
    """
    m, K, bsz = beams.model, beams.K, beams.bsz
    rows = bsz * K
    eos = m.eos
    vocab = lprobs.size(1)
    # a NaN would win the topk (it sorts above everything): make it impossible instead;
    # nan_to_num_ does it in one pass (isnan + masked_fill takes two and a mask)
    lprobs.nan_to_num_(nan=NEG_INF, posinf=POS_INF, neginf=NEG_INF)
    lprobs[:, m.pad] = NEG_INF
    if s.unk_penalty:
        lprobs[:, m.unk] -= s.unk_penalty
    if step < s.min_len:
        lprobs[:, eos] = NEG_INF
    at_limit: list[int] = []  # batch positions whose sentence must end now
    if step >= beams.min_limit:  # host-side ints: no device work for sentences not there yet
        at_limit = [b for b, sent in enumerate(beams.sent_ids) if beams.limits[sent] <= step]
        _force_eos(lprobs.view(bsz, K, vocab), at_limit, eos)
    # EOS candidates are scored apart (one per hypothesis): the topk then ranks only
    # continuations, and its K best are exactly fairseq's active hypotheses (the first
    # K non-EOS among the 2K best candidates, since at most K of those are EOS)
    eos_lprobs = beams.history.eos_lprobs(lprobs, eos, step)  # (rows,)
    lprobs[:, eos] = NEG_INF
    if step == 0 and vocab >= K:
        # every beam holds the same prefix: rank the first copy only (its cum is 0)
        act_scores, act_idx = lprobs.view(bsz, K, vocab)[:, 0].topk(K, dim=1)
    else:
        if beams.total_buf is None or beams.total_buf.size(1) != vocab:
            beams.total_buf = lprobs.new_empty(bsz * K, vocab)
        total = torch.add(lprobs, beams.cum.unsqueeze(1), out=beams.total_buf[:rows])  # (rows, V)
        act_scores, act_idx = total.view(bsz, K * vocab).topk(K, dim=1)  # (bsz, K)
    return act_scores, act_idx, eos_lprobs, at_limit


def _finish_sentences(
    host: np.ndarray, at_limit: list[int], step: int, beams: _Beams, s: SearchSettings
) -> list[int]:
    """Finalise the step's hypotheses that end (`finalise`); a sentence at its maximum length
    is done as well. Returns the batch positions of the sentences finished at this step."""
    newly_finished = finalise(
        host, step, beams.K, s.lenpen, s.normalize_scores, beams.history, beams.sent_ids,
        beams.finalized, beams.blocks, beams.finished,
    )  # fmt: skip
    for b in at_limit:  # a sentence at its maximum length is done
        sent = beams.sent_ids[b]
        if not beams.finished[sent]:
            beams.finished[sent] = True
            newly_finished.append(b)
    return newly_finished


def _reorder(
    beams: _Beams,
    parents: torch.Tensor,
    new_tokens: torch.Tensor,
    new_lprobs: torch.Tensor,
    newly_finished: list[int],
    shrink: bool,
    step: int,
) -> None:
    """Continue the selected hypotheses: finished sentences leave the batch (with ``shrink``),
    the history grows by one token and the decoder state follows the parents."""
    m, K = beams.model, beams.K
    cum = beams.cum  # (bsz, K)
    shrunk = shrink and bool(newly_finished)
    keep: list[int] | None = None
    if shrunk:
        keep = [b for b, sent in enumerate(beams.sent_ids) if not beams.finished[sent]]
        keep_t = index_tensor(keep, beams.history.device)  # (new bsz,)
        parents, new_tokens, new_lprobs, cum = (
            t.index_select(0, keep_t) for t in (parents, new_tokens, new_lprobs, cum)
        )  # (new bsz, K) each
        beams.sent_ids = [beams.sent_ids[b] for b in keep]
        beams.bsz = len(keep)
        beams.min_limit = min(beams.limits[s] for s in beams.sent_ids)
    parents = parents.view(-1)  # (rows',) in this step's numbering
    beams.cum = cum.view(-1)
    beams.history.advance(parents, new_tokens.view(-1), new_lprobs.view(-1), step)
    # every hypothesis continues one of its own sentence's beam: told so, the decoder
    # decides on the host whether its cached encoder output must be copied
    with block_reorder(K, keep):
        m.reorder_incremental_state(beams.state, parents)
    if shrunk:
        # the K copies of a sentence's encoder output are identical, so only removing
        # sentences changes it: a reorder within beams would copy it for nothing
        beams.encoder_out = m.reorder_encoder_out(beams.encoder_out, parents)


def _select(
    act_scores: torch.Tensor,
    act_idx: torch.Tensor,
    lprobs: torch.Tensor,
    eos_lprobs: torch.Tensor,
    cum: torch.Tensor,
    row_offsets: torch.Tensor,
    vocab: int,
    K: int,
    can_finish: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray | None]:
    """The next hypotheses and the finished scores: nine small tensor operations, no sort.

    Args:
        act_scores, act_idx: (bsz, K) the K best continuations of each sentence, best first;
            act_idx indexes beam x vocab.
        lprobs: (rows, V) the step's log-probs; eos_lprobs: (rows,) their EOS column as it was
            before being set apart; cum: (rows,) the hypotheses' cumulative scores.
        row_offsets: (bsz, 1) each sentence's first row.
        can_finish: whether an EOS may finish a hypothesis at this step (step >= min_len).

    Returns:
        parents (bsz, K) rows of this step, the new tokens (bsz, K) and their log-probs
        (bsz, K), and on the host, when ``can_finish``, a (bsz * K,) array holding each row's
        final score if its EOS candidate is among the K best candidates of its sentence, else
        -inf (the one device -> host copy of a step).
    """
    bsz = act_idx.size(0)
    parents = act_idx.div(vocab, rounding_mode="floor").add_(row_offsets)  # (bsz, K)
    new_tokens = act_idx.remainder(vocab)  # (bsz, K)
    new_lprobs = lprobs.view(bsz, K * vocab).gather(1, act_idx)  # (bsz, K)
    if not can_finish:
        return parents, new_tokens, new_lprobs, None
    # hypothesis j's EOS candidate is among the K best candidates of its sentence iff it
    # scores at least the K-th best of continuations and EOS candidates
    eos_scores = (eos_lprobs + cum).view(bsz, K)  # (bsz, K), in row order
    both = torch.cat([act_scores, eos_scores], dim=1)  # (bsz, 2K)
    kth = both.topk(K, dim=1).values[:, -1:]  # (bsz, 1)
    # -inf EOS candidates stay -inf: a finished hypothesis has a finite score
    host = eos_scores.masked_fill(eos_scores < kth, NEG_INF).cpu()  # (bsz, K)
    return parents, new_tokens, new_lprobs, host.numpy().reshape(-1)


def _force_eos(lprobs: torch.Tensor, positions: list[int], eos: int) -> None:
    """Leave only EOS open for the sentences at ``positions`` of a (bsz, K, V) log-prob view."""
    if not positions:
        return
    idx = index_tensor(positions, lprobs.device)  # (n,)
    eos_lprobs = lprobs[idx, :, eos]  # (n, K) a copy
    lprobs[idx] = NEG_INF
    lprobs[idx, :, eos] = eos_lprobs
