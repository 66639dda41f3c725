"""The tensorized beam search: fairseq's SequenceGenerator semantics, hypotheses chosen by tensor ops.

Every step runs one batched incremental decoder call over ``bsz * beam`` rows, scores the last
position only, takes ``2 * beam`` candidates per sentence with one ``topk`` over ``beam x vocab``,
finalises the EOS candidates among the top ``beam`` (the only Python loop, over finished
hypotheses), picks the next ``beam`` hypotheses with tensor operations, and drops every sentence
that has ``beam`` finished hypotheses from the batch, the decoder state and the encoder output.
The host reads one small tensor per step (the finished candidates), never one per hypothesis.
"""

from __future__ import annotations

from typing import Any

import torch

from convseq.search.common import (
    Hypothesis,
    SearchModel,
    SearchTimer,
    as_search_model,
    check_arguments,
    max_lengths,
    phase_of,
)

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
        model: an FConvModel, any model with fairseq's incremental-decoder interface, or a
            `SearchModel` (e.g. an ensemble).
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
        timer: optional hook called around each phase (see `convseq.search.common.PHASES`).
        shrink: remove finished sentences from the batch (off only for measurements).
        fold_weight_norm: fold weight norm into plain weights for the run.
        beamable_mm: compute single-step attention products once per sentence.
        need_attn: return the attention (False skips averaging it).

    Returns:
        Per input sentence, in input order, its ``nbest`` best hypotheses, best first.
    """
    search_model = as_search_model(model)
    check_arguments(src_tokens, src_lengths, beam, nbest, min_len, lenpen)
    if src_tokens.size(0) == 0:
        return []
    context = search_model.generation_context(
        beam if beamable_mm else None, fold_weight_norm, need_attn
    )
    with torch.inference_mode(), context:
        finalized = _search(
            search_model,
            src_tokens,
            src_lengths,
            beam,
            lenpen,
            unk_penalty,
            min_len,
            max_len_a,
            max_len_b,
            normalize_scores,
            timer,
            shrink,
        )
    # stable: equal scores keep the order they were finished in
    return [sorted(hyps, key=lambda h: h["score"], reverse=True)[:nbest] for hyps in finalized]


def _search(
    m: SearchModel,
    src_tokens: torch.Tensor,
    src_lengths: torch.Tensor,
    K: int,
    lenpen: float,
    unk_penalty: float,
    min_len: int,
    max_len_a: float,
    max_len_b: int,
    normalize: bool,
    timer: SearchTimer | None,
    shrink: bool,
) -> list[list[Hypothesis]]:
    phase = phase_of(timer)
    device = src_tokens.device
    bsz, width = src_tokens.shape
    src_lens = src_lengths.tolist()  # one host read per batch
    limits = max_lengths(src_lens, max_len_a, max_len_b, m.max_target_positions(), min_len, width)
    pad, eos, unk = m.pad, m.eos, m.unk

    with phase("encoder"):
        encoder_out = m.encode(src_tokens, src_lengths)
        expand = torch.arange(bsz, device=device).repeat_interleave(K)  # (bsz*K,) 0,0,..,1,1,..
        encoder_out = m.reorder_encoder_out(encoder_out, expand)

    state: dict = {}
    tokens = torch.full((bsz * K, 1), eos, dtype=torch.long, device=device)  # (rows, step+1)
    token_lprobs = torch.zeros(bsz * K, 0, device=device)  # (rows, step): each token's log-prob
    attn: torch.Tensor | None = None  # (rows, step+1, S) once the decoder returns attention
    # all beams of a sentence start identical: only beam 0 is live at step 0 (the others score
    # -inf, which also covers vocabularies smaller than 2 * beam)
    cum = torch.zeros(bsz, K, device=device)
    cum[:, 1:] = NEG_INF
    cum = cum.view(-1)  # (rows,) cumulative log-prob of each hypothesis
    sent_ids = list(range(bsz))  # batch position -> input sentence
    min_limit = min(limits)
    finalized: list[list[Hypothesis]] = [[] for _ in range(bsz)]
    finished = [False] * bsz
    remaining = bsz
    beam_offsets = torch.arange(bsz, device=device).unsqueeze(1) * K  # (bsz, 1) first row of each

    for step in range(max(limits) + 1):
        with phase("decoder"):
            lprobs, step_attn = m.decode(tokens, encoder_out, state)  # (rows, V), (rows, S)

        with phase("candidates"):
            vocab = lprobs.size(1)
            # a NaN would win the topk (it sorts above everything): make it impossible instead;
            # nan_to_num_ does it in one pass (isnan + masked_fill takes two and a mask)
            lprobs.nan_to_num_(nan=NEG_INF, posinf=POS_INF, neginf=NEG_INF)
            lprobs[:, pad] = NEG_INF
            if unk_penalty:
                lprobs[:, unk] -= unk_penalty
            if step < min_len:
                lprobs[:, eos] = NEG_INF
            at_limit: list[int] = []  # batch positions whose sentence must end now
            if step >= min_limit:  # host-side ints: no device work for sentences not there yet
                at_limit = [b for b, sent in enumerate(sent_ids) if limits[sent] <= step]
                _force_eos(lprobs.view(bsz, K, vocab), at_limit, eos)
            if step == 0 and vocab >= 2 * K:
                # every beam holds the same prefix: rank the first copy only (its cum is 0)
                cand_scores, cand_idx = lprobs.view(bsz, K, vocab)[:, 0].topk(2 * K, dim=1)
            else:
                total = (lprobs + cum.unsqueeze(1)).view(bsz, K * vocab)  # (bsz, K*V)
                cand_scores, cand_idx = total.topk(2 * K, dim=1)  # (bsz, 2K), best first

        with phase("selection"):
            cand_lprobs = lprobs.view(bsz, K * vocab).gather(1, cand_idx)  # (bsz, 2K)
            cand_beams = cand_idx.div(vocab, rounding_mode="floor")  # (bsz, 2K)
            cand_tokens = cand_idx - cand_beams * vocab  # (bsz, 2K)
            cand_rows = cand_beams + beam_offsets  # (bsz, 2K) rows in this step's numbering
            cand_eos = cand_tokens.eq(eos) & cand_scores.ne(NEG_INF)  # (bsz, 2K)

        if step_attn is not None:
            with phase("reorder"):
                step_attn = step_attn.unsqueeze(1)  # (rows, 1, S)
                attn = step_attn if attn is None else torch.cat([attn, step_attn], dim=1)

        newly_finished: list[int] = []  # batch positions
        if step >= min_len:  # before min_len no EOS can be finalised: skip the host read
            with phase("selection"):
                top = cand_scores[:, :K]  # (bsz, K)
                if normalize:
                    top = top / ((step + 1) ** lenpen)
                # one device -> host copy per step: which top-K candidates end, their scores, beams
                host = torch.stack(
                    [cand_eos[:, :K].to(top.dtype), top, cand_beams[:, :K].to(top.dtype)]
                )
                host = host.view(3, -1).cpu()  # (3, bsz*K)
            with phase("finalisation"):
                newly_finished = _finalise(
                    host,
                    step,
                    K,
                    tokens,
                    token_lprobs,
                    cand_lprobs[:, :K],
                    attn,
                    sent_ids,
                    finalized,
                    finished,
                    src_lens,
                    width,
                    eos,
                )
                for b in at_limit:  # a sentence at its maximum length is done
                    sent = sent_ids[b]
                    if not finished[sent]:
                        finished[sent] = True
                        newly_finished.append(b)
            remaining -= len(newly_finished)
        if remaining == 0:
            break

        shrunk = False
        if shrink and newly_finished:
            with phase("reorder"):
                keep = [b for b, sent in enumerate(sent_ids) if not finished[sent]]
                keep_t = torch.tensor(keep, device=device)  # (new bsz,)
                # cand_rows keeps the old numbering: the state is reordered and shrunk at once
                cand_scores, cand_tokens, cand_rows, cand_lprobs, cand_eos = (
                    t.index_select(0, keep_t)
                    for t in (cand_scores, cand_tokens, cand_rows, cand_lprobs, cand_eos)
                )
                sent_ids = [sent_ids[b] for b in keep]
                bsz = len(keep)
                beam_offsets = beam_offsets[:bsz]
                min_limit = min(limits[s] for s in sent_ids)
                shrunk = True

        with phase("selection"):
            # fairseq's active-hypothesis trick, as one stable sort: EOS candidates go behind
            # every other candidate, the rest keep their rank, so the first K are the K best
            # continuing hypotheses
            flags = cand_eos.to(torch.uint8)  # bytes: sortable on every device
            active = flags.sort(dim=1, stable=True).indices[:, :K]  # (bsz, K), best first
            parents = cand_rows.gather(1, active).view(-1)  # (bsz*K,) the row each continues
            new_tokens = cand_tokens.gather(1, active).view(-1, 1)  # (bsz*K, 1)
            new_lprobs = cand_lprobs.gather(1, active).view(-1, 1)  # (bsz*K, 1)
            cum = cand_scores.gather(1, active).view(-1)  # (bsz*K,)

        with phase("reorder"):
            tokens = torch.cat([tokens.index_select(0, parents), new_tokens], dim=1)
            token_lprobs = torch.cat([token_lprobs.index_select(0, parents), new_lprobs], dim=1)
            if attn is not None:
                attn = attn.index_select(0, parents)  # (rows, step+1, S)
            m.reorder_incremental_state(state, parents)
            if shrunk:
                # the K copies of a sentence's encoder output are identical, so only removing
                # sentences changes it: a reorder within beams would copy it for nothing
                encoder_out = m.reorder_encoder_out(encoder_out, parents)
    return finalized


def _force_eos(lprobs: torch.Tensor, positions: list[int], eos: int) -> None:
    """Leave only EOS open for the sentences at ``positions`` of a (bsz, K, V) log-prob view."""
    if not positions:
        return
    idx = torch.tensor(positions, device=lprobs.device)  # (n,)
    eos_lprobs = lprobs[idx, :, eos]  # (n, K) a copy
    lprobs[idx] = NEG_INF
    lprobs[idx, :, eos] = eos_lprobs


def _finalise(
    host: torch.Tensor,
    step: int,
    K: int,
    tokens: torch.Tensor,
    token_lprobs: torch.Tensor,
    eos_lprobs: torch.Tensor,
    attn: torch.Tensor | None,
    sent_ids: list[int],
    finalized: list[list[Hypothesis]],
    finished: list[bool],
    src_lens: list[int],
    width: int,
    eos: int,
) -> list[int]:
    """Store the EOS candidates among the top K; return the batch positions now complete.

    Args:
        host: (3, bsz*K) on the CPU: is-EOS flag, final score and beam of each top-K candidate.
        tokens: (rows, step+1) the decoder input of this step (leading EOS first).
        token_lprobs: (rows, step) the log-probs of those tokens.
        eos_lprobs: (bsz, K) the log-prob of each top-K candidate's token.
        attn: (rows, step+1, S) the attention of every step so far, or None.
    """
    hits = host[0].nonzero().squeeze(1)  # CPU: flat positions b*K + j, sentence then rank
    if hits.numel() == 0:
        return []
    scores = host[1].index_select(0, hits).tolist()
    beams = host[2].index_select(0, hits).long().tolist()
    picks = []  # (position, row, batch position, sentence, score)
    taken: dict[int, int] = {}
    for p, beam, score in zip(hits.tolist(), beams, scores):
        b = p // K
        sent = sent_ids[b]
        n = len(finalized[sent]) + taken.get(sent, 0)
        if finished[sent] or n >= K:
            continue
        taken[sent] = taken.get(sent, 0) + 1
        picks.append((p, b * K + beam, b, sent, score))
    if not picks:
        return []

    device = tokens.device
    rows = torch.tensor([r for _, r, _, _, _ in picks], device=device)  # (n,)
    positions = torch.tensor([p for p, _, _, _, _ in picks], device=device)  # (n,)
    n = len(picks)
    hyp_tokens = torch.cat(
        [tokens.index_select(0, rows)[:, 1:], tokens.new_full((n, 1), eos)], dim=1
    )  # (n, step+1): the leading EOS dropped, the final one added
    last = eos_lprobs.reshape(-1).index_select(0, positions).unsqueeze(1)  # (n, 1)
    hyp_lprobs = torch.cat([token_lprobs.index_select(0, rows), last], dim=1)  # (n, step+1)
    hyp_attn = None if attn is None else attn.index_select(0, rows)  # (n, step+1, S)

    done = []
    for i, (_, _, b, sent, score) in enumerate(picks):
        attention = None
        if hyp_attn is not None:
            attention = hyp_attn[i, :, width - src_lens[sent] :].t()  # (src_len, step+1)
        finalized[sent].append(
            {
                "tokens": hyp_tokens[i],
                "score": score,
                "positional_scores": hyp_lprobs[i],
                "attention": attention,
            }
        )
        if len(finalized[sent]) == K:
            finished[sent] = True
            done.append(b)
    return done
