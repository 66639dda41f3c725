"""The reference beam search: the same semantics as `beam_search`, the Lua toolkit's loop structure.

Each step makes the same batched incremental decoder call as the tensorized search and fairseq's
``topk`` of ``2 * beam`` over ``beam x vocab`` (tensor operations in the Lua toolkit too, into
reused buffers); then everything else is plain Python, sentence by sentence and candidate by
candidate, as Lua fairseq's ``selectHypos`` did it: each candidate is either finalised (EOS among
the top ``beam``), taken as a continuing hypothesis, or skipped, and a sentence's walk stops once
it has ``beam`` continuations; finished hypotheses are rebuilt by following per-step back-pointers;
finished sentences are dropped from the batch. The decoder input is extended with the same tensor
operations as in the tensorized search, so that the two differ only in selection, finalisation
and the bookkeeping of the history.

It exists to check the tensorized search (the tests) and to measure what tensorizing gained
(bench/bench_search.py). It is never the default. It shares no selection code with `beam.py`.
"""

from __future__ import annotations

from typing import Any

import torch

from convseq.search.interface import Hypothesis
from convseq.search.run import SearchBatch, SearchSettings, length_normalise, run_search
from convseq.search.timing import SearchTimer, phase_of

NEG_INF = float("-inf")


def reference_beam_search(
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
    fold_weight_norm: bool = True,
    beamable_mm: bool = True,
    need_attn: bool = True,
) -> list[list[Hypothesis]]:
    """`convseq.search.beam_search`'s contract, computed with per-hypothesis Python loops."""
    settings = SearchSettings(
        beam, lenpen, unk_penalty, min_len, max_len_a, max_len_b, nbest, normalize_scores,
        fold_weight_norm, beamable_mm, need_attn,
    )  # fmt: skip

    def search(batch: SearchBatch) -> list[list[Hypothesis]]:
        return _ReferenceSearch(batch, settings, timer).run()

    finalized = run_search(search, model, src_tokens, src_lengths, settings)
    return [sorted(hyps, key=lambda h: h["score"], reverse=True)[:nbest] for hyps in finalized]


class _ReferenceSearch:
    """One batch's search; the history is kept as per-step back-pointers, like Lua's."""

    def __init__(self, batch: SearchBatch, settings: SearchSettings, timer: SearchTimer | None):
        self.m, self.src_tokens, self.src_lengths = batch.model, batch.src_tokens, batch.src_lengths
        self.src_lens, self.limits = batch.src_lens, batch.limits
        self.width = batch.src_tokens.size(1)
        s = settings
        self.beam, self.lenpen, self.unk_penalty = s.beam, s.lenpen, s.unk_penalty
        self.min_len, self.normalize = s.min_len, s.normalize_scores
        self.phase = phase_of(timer)
        # per step: for each row of the next step, its token, parent row and token log-prob
        self.tokens: list[list[int]] = []
        self.parents: list[list[int]] = []
        self.lprobs: list[list[float]] = []
        self.attn: list[torch.Tensor | None] = []  # per step: (rows, S) on the device
        self._total: torch.Tensor | None = None  # (rows, V) scores of every continuation

    def run(self) -> list[list[Hypothesis]]:
        """Per input sentence, its finished hypotheses, in finishing order."""
        m, K, device = self.m, self.beam, self.src_tokens.device
        n_sent = self.src_tokens.size(0)
        with self.phase("encoder"):
            encoder_out = m.encode(self.src_tokens, self.src_lengths)
            expand = [s for s in range(n_sent) for _ in range(K)]
            encoder_out = m.reorder_encoder_out(encoder_out, torch.tensor(expand, device=device))

        state: dict = {}
        sentences = list(range(n_sent))  # the sentence of each batch position
        # decoder input of each row (built with the same tensor operations as the tensorized
        # search, so that only selection, finalisation and shrinking differ)
        prev = torch.full((n_sent * K, 1), m.eos, dtype=torch.long, device=device)
        scores = [0.0] * (n_sent * K)  # cumulative log-prob of each row
        finalized: list[list[Hypothesis]] = [[] for _ in range(n_sent)]

        for step in range(max(self.limits) + 1):
            with self.phase("decoder"):
                lprobs, attn = m.decode(prev, encoder_out, state)  # (rows, V), (rows, S)
            self.attn.append(attn)

            with self.phase("candidates"):
                lprobs = self._mask(lprobs, step, sentences)
                best = self._topk(lprobs, scores, step, len(sentences))

            with self.phase("selection"):
                active_rows, to_finalise = self._select(best, lprobs.size(1), sentences, finalized)

            with self.phase("finalisation"):
                for sent, row, score, lp in to_finalise:
                    finalized[sent].append(self._backtrack(sent, row, step, score, lp))

            keep = [
                b
                for b, sent in enumerate(sentences)
                if len(finalized[sent]) < K and step < self.limits[sent]
            ]
            if not keep:
                break

            with self.phase("reorder"):
                shrunk = len(keep) < len(sentences)
                order, tokens, scores = self._record_step(keep, active_rows)
                sentences = [sentences[b] for b in keep]
                order_t = torch.tensor(order, device=device)
                new_tokens = torch.tensor(tokens, device=device).unsqueeze(1)  # (rows', 1)
                prev = torch.cat([prev.index_select(0, order_t), new_tokens], dim=1)
                m.reorder_incremental_state(state, order_t)
                if shrunk:  # within-beam moves leave the (identical) encoder copies unchanged
                    encoder_out = m.reorder_encoder_out(encoder_out, order_t)
        return finalized

    def _select(
        self,
        best: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        vocab: int,
        sentences: list[int],
        finalized: list[list[Hypothesis]],
    ) -> tuple[list[list[tuple[int, int, float, float]]], list[tuple[int, int, float, float]]]:
        """Lua's ``selectHypos``: every sentence, every candidate, in Python: continue, finalise
        or skip.

        Returns:
            per batch position, its K continuations (row, token, score, token log-prob), and
            the hypotheses to finalise (sentence, row, score, EOS log-prob).
        """
        m, K = self.m, self.beam
        values, idx, token_lps = (t.tolist() for t in best)  # per sentence, best first
        active_rows: list[list[tuple[int, int, float, float]]] = []
        to_finalise: list[tuple[int, int, float, float]] = []  # (sentence, row, score, lp)
        for b, sent in enumerate(sentences):
            active: list[tuple[int, int, float, float]] = []
            slots = K - len(finalized[sent])  # finished hypotheses it can still take
            for j, (score, flat, lp) in enumerate(zip(values[b], idx[b], token_lps[b])):
                beam, token = divmod(flat, vocab)
                if token == m.eos and score != NEG_INF:
                    if j < K and slots > 0:
                        to_finalise.append((sent, b * K + beam, score, lp))
                        slots -= 1
                elif len(active) < K:
                    active.append((b * K + beam, token, score, lp))
                if len(active) == K and j >= K - 1:
                    break  # K continuations and no EOS left among the top K
            while len(active) < K:  # too few candidates (tiny vocabularies): dead rows
                active.append((b * K, m.pad, NEG_INF, NEG_INF))
            active_rows.append(active)
        return active_rows, to_finalise

    def _record_step(
        self, keep: list[int], active_rows: list[list[tuple[int, int, float, float]]]
    ) -> tuple[list[int], list[int], list[float]]:
        """Append the kept sentences' continuations to the back-pointer history.

        Returns:
            for each row of the next step: its parent row, its token and its cumulative score.
        """
        order, tokens, lps, new_scores = [], [], [], []
        for b in keep:
            for row, token, score, lp in active_rows[b]:
                order.append(row)
                tokens.append(token)
                lps.append(lp)
                new_scores.append(score)
        self.tokens.append(tokens)
        self.parents.append(order)
        self.lprobs.append(lps)
        return order, tokens, new_scores

    def _mask(self, lprobs: torch.Tensor, step: int, sentences: list[int]) -> torch.Tensor:
        """Forbidden tokens get -inf; penalties; EOS forbidden early, forced at the limit."""
        m, K = self.m, self.beam
        lprobs.nan_to_num_(nan=NEG_INF, posinf=float("inf"), neginf=NEG_INF)  # ours to modify
        lprobs[:, m.pad] = NEG_INF
        if self.unk_penalty:
            lprobs[:, m.unk] -= self.unk_penalty
        if step < self.min_len:
            lprobs[:, m.eos] = NEG_INF
        for b, sent in enumerate(sentences):
            if step >= self.limits[sent]:
                rows = slice(b * K, (b + 1) * K)
                eos_col = lprobs[rows, m.eos].clone()
                lprobs[rows] = NEG_INF
                lprobs[rows, m.eos] = eos_col
        return lprobs

    def _topk(
        self, lprobs: torch.Tensor, scores: list[float], step: int, bsz: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per sentence, its best (score, index into beam x vocab, token log-prob), best first."""
        K = self.beam
        vocab = lprobs.size(1)
        if step == 0:
            # every beam holds the same prefix: candidates come from the first row only
            first = lprobs.view(bsz, K, vocab)[:, 0, :]  # (bsz, V)
            values, idx = first.topk(min(2 * K, vocab), dim=1)  # (bsz, k)
            return values, idx, first.gather(1, idx)  # beam 0 only: idx < V
        cum = torch.tensor(scores, dtype=lprobs.dtype, device=lprobs.device)  # (rows,)
        if self._total is None or self._total.shape[1] != vocab:
            self._total = torch.empty_like(lprobs)  # reused (as the Lua toolkit reused buffers)
        total = torch.add(lprobs, cum.unsqueeze(1), out=self._total[: lprobs.size(0)])
        total = total.view(bsz, K * vocab)  # (bsz, K*V)
        values, idx = total.topk(2 * K, dim=1)  # (bsz, 2K)
        return values, idx, lprobs.view(bsz, K * vocab).gather(1, idx)

    def _backtrack(self, sent: int, row: int, step: int, score: float, lp: float) -> Hypothesis:
        """Rebuild a hypothesis ending in EOS at ``step`` from ``row`` (this step's numbering)."""
        tokens, lps, attns = [self.m.eos], [lp], []
        attn_row = row
        for s in range(step - 1, -1, -1):
            if self.attn[s + 1] is not None:
                attns.append(self.attn[s + 1][attn_row])
            tokens.append(self.tokens[s][attn_row])
            lps.append(self.lprobs[s][attn_row])
            attn_row = self.parents[s][attn_row]
        if self.attn[0] is not None:
            attns.append(self.attn[0][attn_row])
        device = self.src_tokens.device
        attention = None
        if attns:
            full = torch.stack(attns[::-1], dim=1)  # (S, step+1)
            attention = full[self.width - self.src_lens[sent] :]  # (src_len, step+1)
        return {
            "tokens": torch.tensor(tokens[::-1], device=device),
            "score": length_normalise(score, step + 1, self.lenpen, self.normalize),
            "positional_scores": torch.tensor(lps[::-1], device=device),
            "attention": attention,
        }
