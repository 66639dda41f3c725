"""Searches against answers found without them: enumeration, and distributions scripted by hand."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from convseq.models.fconv import FConvModel
from convseq.search import beam_search, greedy, reference_beam_search

BOS, PAD, EOS, UNK, A, B = 0, 1, 2, 3, 4, 5
SEARCHES = [beam_search, reference_beam_search]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- exhaustive oracle

TINY = dict(
    encoder_embed_dim=8,
    encoder_layers="[(12, 3)]",
    decoder_embed_dim=8,
    decoder_layers="[(12, 2)] * 2",
    decoder_out_embed_dim=8,
    dropout=0.0,
)
MAX_LEN = 3  # at most 3 tokens before the EOS
WORDS = [BOS, UNK, A, B]  # every token a hypothesis may hold before its EOS (pad is never allowed)


def enumerate_scores(model, src, unk_penalty):
    """Every output of 1..MAX_LEN tokens + EOS with its log-prob sum, by teacher forcing."""
    out = {}
    for n in range(1, MAX_LEN + 1):
        seqs = list(itertools.product(WORDS, repeat=n))
        target = torch.tensor([list(s) + [EOS] for s in seqs])  # (N, n+1)
        prev = torch.cat([torch.full((len(seqs), 1), EOS), target[:, :-1]], dim=1)  # (N, n+1)
        with torch.no_grad():
            logits, _ = model(src.expand(len(seqs), -1), None, prev)  # (N, n+1, V)
        lprobs = F.log_softmax(logits.float(), dim=-1).gather(2, target.unsqueeze(2)).squeeze(2)
        lprobs = lprobs - unk_penalty * target.eq(UNK)  # (N, n+1)
        for s, total in zip(seqs, lprobs.sum(dim=1).tolist()):
            out[s + (EOS,)] = total
    return out


@pytest.mark.parametrize("search", SEARCHES)
def test_a_beam_holding_every_prefix_finds_the_best_sequence(search):
    torch.manual_seed(0)
    model = FConvModel.build(TINY, 10, len(WORDS) + 2).eval()  # V = 6: bos pad eos unk a b
    src = torch.tensor([[7, 5, 9, EOS]])
    unk_penalty = 0.3
    truth = enumerate_scores(model, src, unk_penalty)
    assert len(truth) == 4 + 16 + 64
    ranked = sorted(truth.items(), key=lambda kv: kv[1], reverse=True)
    assert ranked[0][1] - ranked[1][1] > 1e-3  # a unique optimum, by a margin

    # 64 live prefixes before the last step: the beam must hold 64 (> V - 1 = 5; not capped)
    for beam in (64, 100):
        out = search(
            model, src, torch.tensor([4]), beam=beam, nbest=beam, max_len_b=MAX_LEN,
            normalize_scores=False, unk_penalty=unk_penalty,
        )[0]  # fmt: skip
        best = out[0]
        assert tuple(best["tokens"].tolist()) == ranked[0][0]
        assert math.isclose(best["score"], ranked[0][1], rel_tol=1e-5)
        # every hypothesis found is a real output with its true score
        for h in out:
            assert math.isclose(h["score"], truth[tuple(h["tokens"].tolist())], rel_tol=1e-5)
        if beam == 100:  # wide enough to finish every sequence: the whole ranking comes back
            assert len(out) == len(truth)
            assert {tuple(h["tokens"].tolist()) for h in out} == set(truth)


# ---------------------------------------------------------------- scripted probabilities

# next-token distributions by (source key, output prefix); unscripted prefixes only ever
# occur on dead hypotheses (score -inf) and get {EOS: 1}
SCRIPT = {
    # sentence X: an EOS that wins only after length normalisation (beam 2)
    ("X", ()): {A: 0.6, B: 0.4},
    ("X", (A,)): {EOS: 0.5, A: 0.3, B: 0.2},
    ("X", (B,)): {A: 0.9, EOS: 0.1},
    ("X", (B, A)): {EOS: 0.8, B: 0.2},
    ("X", (A, A)): {EOS: 0.7, B: 0.3},
    # sentence Y: the unknown word is likeliest
    ("Y", ()): {UNK: 0.5, A: 0.3, EOS: 0.2},
    ("Y", (UNK,)): {EOS: 0.9, A: 0.1},
    ("Y", (A,)): {EOS: 0.7, B: 0.3},
    # sentence Z: EOS is likely early (min_len) and never late (the forced EOS)
    ("Z", ()): {A: 0.6, EOS: 0.4},
    ("Z", (A,)): {EOS: 0.7, B: 0.3},
    ("Z", (A, B)): {A: 0.8, EOS: 0.2},
    ("Z", (A, B, A)): {A: 0.9, EOS: 0.1},
    # sentence W: two EOS candidates among the top 2 for its last free slot (beam 2)
    ("W", ()): {A: 0.6, B: 0.4},
    ("W", (A,)): {EOS: 0.6, B: 0.4},
    ("W", (B,)): {A: 0.8, EOS: 0.2},
    ("W", (B, A)): {EOS: 0.6, A: 0.4},
    ("W", (A, B)): {EOS: 0.85, A: 0.15},
}
KEYS = {10: "X", 11: "Y", 12: "Z", 13: "W"}  # the source's first real token picks the script


class ScriptedEncoder(nn.Module):
    def forward(self, src_tokens, src_lengths):
        first = src_tokens.gather(1, (src_tokens.size(1) - src_lengths).unsqueeze(1))  # (B, 1)
        return {"key": first.squeeze(1)}

    def reorder_encoder_out(self, encoder_out, new_order):
        return {"key": encoder_out["key"].index_select(0, new_order)}


class ScriptedDecoder(nn.Module):
    """Log-probs read from SCRIPT; incremental (last position) or over the whole prefix."""

    padding_idx = PAD

    def __init__(self):
        super().__init__()
        self.rows: list[int] = []  # rows of each incremental call

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None):
        rows, length = prev_output_tokens.shape
        positions = [length - 1] if incremental_state is not None else list(range(length))
        if incremental_state is not None:
            self.rows.append(rows)
        logits = torch.full((rows, len(positions), 6), -math.inf)
        keys = encoder_out["key"].tolist()
        for r in range(rows):
            for i, t in enumerate(positions):
                prefix = tuple(prev_output_tokens[r, 1 : t + 1].tolist())
                for token, p in SCRIPT.get((KEYS[keys[r]], prefix), {EOS: 1.0}).items():
                    logits[r, i, token] = math.log(p)
        return logits, None

    def reorder_incremental_state(self, incremental_state, new_order):
        pass  # stateless: the whole prefix comes with every call


class ScriptedModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = ScriptedEncoder()
        self.decoder = ScriptedDecoder()

    def max_positions(self):
        return (100, 100)


def source(*keys: str) -> tuple[torch.Tensor, torch.Tensor]:
    code = {v: k for k, v in KEYS.items()}
    return torch.tensor([[code[k], 20, EOS] for k in keys]), torch.tensor([3] * len(keys))


def summary(hyps):
    return [(h["tokens"].tolist(), h["score"], h["positional_scores"].tolist()) for h in hyps]


def assert_hyps(got, expected):
    assert len(got) == len(expected)
    for (tokens, score, positional), (e_tokens, e_score, e_positional) in zip(got, expected):
        assert tokens == e_tokens
        assert math.isclose(score, e_score, rel_tol=1e-5)
        assert positional == pytest.approx(e_positional, rel=1e-5)


ln = math.log
# X, beam 2 (worked by hand):
# step 0: A -0.511, B -0.916 (EOS forbidden by min_len 1) -> beams A, B
# step 1: BA -1.022, A.EOS -1.204, AA -1.715, AB -2.120, B.EOS -3.219
#         top 2 = BA, A.EOS: A.EOS is finished; beams BA, AA
# step 2: BA.EOS -1.245, AA.EOS -2.071, BAB -2.631, AAB -2.919
#         top 2 = BA.EOS, AA.EOS: BA.EOS is the second finished one; X is done
# normalised: BA.EOS -1.245 / 3 = -0.415 beats A.EOS -1.204 / 2 = -0.602; unnormalised A.EOS wins
X_A = ([A, EOS], ln(0.6 * 0.5), [ln(0.6), ln(0.5)])
X_BA = ([B, A, EOS], ln(0.4 * 0.9 * 0.8), [ln(0.4), ln(0.9), ln(0.8)])


@pytest.mark.parametrize("search", SEARCHES)
def test_scripted_length_normalisation_decides(search):
    src, lengths = source("X")
    normalised = search(ScriptedModel(), src, lengths, beam=2, nbest=2)[0]
    assert_hyps(summary(normalised), [
        (X_BA[0], X_BA[1] / 3, X_BA[2]),
        (X_A[0], X_A[1] / 2, X_A[2]),
    ])  # fmt: skip
    for args in (dict(normalize_scores=False), dict(lenpen=0.0)):
        plain = search(ScriptedModel(), src, lengths, beam=2, nbest=2, **args)[0]
        assert_hyps(summary(plain), [X_A, X_BA])


@pytest.mark.parametrize("search", SEARCHES + [greedy])
def test_scripted_unk_penalty(search):
    src, lengths = source("Y")
    beam = {} if search is greedy else {"beam": 1}
    # no penalty: UNK (0.5) then EOS (0.9)
    out = search(ScriptedModel(), src, lengths, **beam)[0]
    assert_hyps(summary(out), [([UNK, EOS], ln(0.5 * 0.9) / 2, [ln(0.5), ln(0.9)])])
    # a small penalty is paid in the token's score but UNK still wins: -0.793 > ln 0.3 = -1.204
    out = search(ScriptedModel(), src, lengths, unk_penalty=0.1, **beam)[0]
    assert_hyps(summary(out), [([UNK, EOS], (ln(0.5 * 0.9) - 0.1) / 2, [ln(0.5) - 0.1, ln(0.9)])])
    # a penalty of 1: UNK -1.693 < A -1.204, then EOS (0.7)
    out = search(ScriptedModel(), src, lengths, unk_penalty=1.0, **beam)[0]
    assert_hyps(summary(out), [([A, EOS], ln(0.3 * 0.7) / 2, [ln(0.3), ln(0.7)])])


@pytest.mark.parametrize("search", SEARCHES + [greedy])
def test_scripted_min_len_and_forced_eos(search):
    src, lengths = source("Z")
    beam = {} if search is greedy else {"beam": 1}
    # EOS forbidden at steps 0 and 1 (min_len 2): A, then B although EOS has 0.7; then A
    # (0.8 > 0.2); at step 3 = max_len_b, EOS is forced although it has only 0.1
    out = search(ScriptedModel(), src, lengths, min_len=2, max_len_b=3, **beam)[0]
    probs = [0.6, 0.3, 0.8, 0.1]
    assert_hyps(
        summary(out),
        [([A, B, A, EOS], ln(math.prod(probs)) / 4, [ln(p) for p in probs])],
    )
    # without min_len: A then EOS (0.7)
    out = search(ScriptedModel(), src, lengths, max_len_b=3, **beam)[0]
    assert_hyps(summary(out), [([A, EOS], ln(0.6 * 0.7) / 2, [ln(0.6), ln(0.7)])])


@pytest.mark.parametrize("search", SEARCHES)
def test_scripted_batch_shrinks_as_sentences_finish(search):
    # beam 2, three sentences:
    # Y: step 0 beams UNK -0.693, A -1.204; step 1 UNK.EOS -0.799, A.EOS -1.561 are the top 2
    #    and both EOS: Y is done after step 1
    # Z: step 0 only A is possible (EOS forbidden): beams A -0.511 and a dead one (-inf);
    #    step 1: A.EOS -0.868 (finished), AB -1.715; step 2: ABA -1.938, AB.EOS -3.324 are the
    #    top 2: AB.EOS is the second finished one; Z is done after step 2, like X
    src, lengths = source("X", "Y", "Z")
    model = ScriptedModel()
    out = search(model, src, lengths, beam=2, nbest=2)
    assert model.decoder.rows == [6, 6, 4]  # Y left the batch after step 1
    assert_hyps(summary(out[0]), [
        (X_BA[0], X_BA[1] / 3, X_BA[2]),
        (X_A[0], X_A[1] / 2, X_A[2]),
    ])  # fmt: skip
    assert_hyps(summary(out[1]), [
        ([UNK, EOS], ln(0.5 * 0.9) / 2, [ln(0.5), ln(0.9)]),
        ([A, EOS], ln(0.3 * 0.7) / 2, [ln(0.3), ln(0.7)]),
    ])  # fmt: skip
    assert_hyps(summary(out[2]), [
        ([A, EOS], ln(0.6 * 0.7) / 2, [ln(0.6), ln(0.7)]),
        ([A, B, EOS], ln(0.6 * 0.3 * 0.2) / 3, [ln(0.6), ln(0.3), ln(0.2)]),
    ])  # fmt: skip


@pytest.mark.parametrize("search", SEARCHES)
def test_scripted_the_better_eos_takes_the_last_slot(search):
    # W, beam 2:
    # step 0: A -0.511, B -0.916
    # step 1: A.EOS -1.022, BA -1.139, AB -1.427, B.EOS -2.526: A.EOS finishes (one slot
    #         left); beams BA (row 0), AB (row 1)
    # step 2: AB.EOS -1.590, BA.EOS -1.650, BAA -2.056, ABA -3.324: both EOS candidates are
    #         among the top 2 but one slot is left: the better one, AB.EOS from the second
    #         beam, takes it (not BA.EOS, which comes first in row order)
    src, lengths = source("W")
    out = search(ScriptedModel(), src, lengths, beam=2, nbest=2)[0]
    assert_hyps(summary(out), [
        ([A, EOS], ln(0.6 * 0.6) / 2, [ln(0.6), ln(0.6)]),
        ([A, B, EOS], ln(0.6 * 0.4 * 0.85) / 3, [ln(0.6), ln(0.4), ln(0.85)]),
    ])  # fmt: skip
