"""The tensorized search's per-row history: tokens, their log-probs and attention, preallocated.

Every step the surviving hypotheses are reordered to their parents; the history is copied with
one ``index_select`` per tensor into the other of two buffers allocated once per batch (sized
for the longest sentence), instead of being concatenated into a new tensor at every step.
"""

from __future__ import annotations

import torch


class History:
    """Double-buffered history of ``rows`` hypotheses over at most ``steps`` decoding steps.

    Row ``r`` of the current buffers is hypothesis ``r`` of this step's numbering; only the first
    ``rows`` rows (which shrink with the batch) and the first ``step + 1`` columns are valid.

    Args:
        rows: hypotheses at the first step (sentences x beam).
        steps: decoding steps at most (the longest sentence's limit + 1).
        eos: the token every decoder input starts with.
        device: where the search runs.
    """

    def __init__(self, rows: int, steps: int, eos: int, device: torch.device):
        self.device = device
        # decoder input: EOS, then one token per step. Filled with EOS: at `step` the current
        # buffer's column step + 1 has never been written (each step writes columns up to
        # step + 1 of the other buffer), so it already holds the final EOS of a hypothesis
        # finished at `step`
        self._tokens = [
            torch.full((rows, steps + 1), eos, dtype=torch.long, device=device) for _ in "ab"
        ]
        self._lprobs = [torch.empty(rows, steps, device=device) for _ in "ab"]  # each token's
        # (rows, steps, S) once the decoder returns attention: time before source, so that a
        # row's history is one contiguous block (index_select copies it in one piece)
        self._attn: list[torch.Tensor] | None = None
        self._cur = 0
        self._steps = steps

    def tokens(self, rows: int, step: int) -> torch.Tensor:
        """(rows, step + 1) the decoder input of ``step``: a strided view (as fairseq passes)."""
        return self._tokens[self._cur][:rows, : step + 1]

    def store_attention(self, attn: torch.Tensor, step: int) -> None:
        """Keep ``attn`` (rows, S), the attention of ``step``, as the history's column ``step``."""
        if self._attn is None:
            shape = (attn.size(0), self._steps, attn.size(1))
            self._attn = [attn.new_empty(shape) for _ in "ab"]  # (rows, steps, S)
        self._attn[self._cur][: attn.size(0), step] = attn

    def eos_lprobs(self, lprobs: torch.Tensor, eos: int, step: int) -> torch.Tensor:
        """Keep every row's EOS log-prob of ``step``; returns it as a (rows,) view.

        It is stored in the column the next step overwrites, so that a hypothesis finished at
        ``step`` has its whole history, final EOS included, in one row of the buffers.
        """
        column = self._lprobs[self._cur][: lprobs.size(0), step]  # (rows,) strided view
        return column.copy_(lprobs[:, eos])

    def finished(
        self, rows: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The history of hypotheses ending with EOS at ``step``, one gather per tensor.

        Args:
            rows: (n,) the finished hypotheses' rows in this step's numbering.
            step: the current step (its EOS log-probs and attention already stored).

        Returns:
            (n, step + 1) tokens ending in EOS (the leading EOS dropped), (n, step + 1) their
            log-probs and (n, S, step + 1) their attention (a transposed view), or None.
        """
        cur = self._cur
        tokens = self._tokens[cur][:, 1 : step + 2].index_select(0, rows)  # (n, step+1)
        lprobs = self._lprobs[cur][:, : step + 1].index_select(0, rows)  # (n, step+1)
        if self._attn is None:
            return tokens, lprobs, None
        attn = self._attn[cur][:, : step + 1].index_select(0, rows)  # (n, step+1, S)
        return tokens, lprobs, attn.transpose(1, 2)

    def advance(
        self, parents: torch.Tensor, tokens: torch.Tensor, lprobs: torch.Tensor, step: int
    ) -> None:
        """Row i of the next step continues row ``parents[i]`` with ``tokens[i]``.

        Args:
            parents: (rows',) rows of this step (fewer when sentences left the batch).
            tokens: (rows',) the tokens appended; lprobs: (rows',) their log-probs.
            step: the current step (its attention already stored, if any).
        """
        src, dst = self._cur, 1 - self._cur
        n = parents.size(0)
        # out= into the other buffer: no allocation, one copy of the history per step
        torch.index_select(
            self._tokens[src][:, : step + 1], 0, parents, out=self._tokens[dst][:n, : step + 1]
        )
        self._tokens[dst][:n, step + 1] = tokens
        if step > 0:
            torch.index_select(
                self._lprobs[src][:, :step], 0, parents, out=self._lprobs[dst][:n, :step]
            )
        self._lprobs[dst][:n, step] = lprobs
        if self._attn is not None:
            torch.index_select(
                self._attn[src][:, : step + 1], 0, parents, out=self._attn[dst][:n, : step + 1]
            )
        self._cur = dst
