"""The beam search against the reference search and greedy decoding, on small fconv models.

The models have random weights with sharpened output logits (the vocabulary projection scaled up)
so that candidates never tie; every comparison first asserts a top-k margin over the log-probs the
search actually saw, which is what makes "identical hypotheses" a fair demand.
"""

from __future__ import annotations

import ast
import copy
import math
from pathlib import Path

import pytest
import torch

import convseq.models.decoder as decoder_module
from convseq.models.fconv import FConvModel
from convseq.modules.weight_norm import weight_norm_parts
from convseq.search import (
    PHASES,
    IncrementalDecoderModel,
    PhaseTimer,
    beam_search,
    greedy,
    reference_beam_search,
)
from convseq.search.buffers import History

PAD, EOS, UNK = 1, 2, 3
V_SRC, V_TGT = 30, 40
SEARCH_DIR = Path(__file__).resolve().parents[2] / "src" / "convseq" / "search"

SMALL = dict(
    encoder_embed_dim=16,
    encoder_layers="[(24, 3)] * 2",
    decoder_embed_dim=16,
    decoder_layers="[(24, 3), (24, 2)]",
    decoder_out_embed_dim=16,
    dropout=0.1,
)
LENGTHS = [3, 9, 6, 12, 2, 7]  # source lengths, EOS included; one sentence at the full width


def sharp_model(seed: int = 0, scale: float = 8.0, eos_bias: float = 1.5, unk_bias: float = 1.0):
    """A random model whose logits are spread out (no ties), with EOS and unk made likely."""
    torch.manual_seed(seed)
    model = FConvModel.build(SMALL, V_SRC, V_TGT)
    with torch.no_grad():
        weight_norm_parts(model.decoder.fc3)[0].mul_(scale)  # g: the output weight's norm
        model.decoder.fc3.bias[EOS] += eos_bias
        model.decoder.fc3.bias[UNK] += unk_bias
    return model.eval()


def batch(lengths: list[int], seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded source batch, each row ending in EOS, and its lengths."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    src = torch.full((len(lengths), width), PAD)
    for i, n in enumerate(lengths):
        src[i, width - n :] = torch.randint(4, V_SRC, (n,), generator=g)
        src[i, -1] = EOS
    return src, torch.tensor(lengths)


class Recorder(IncrementalDecoderModel):
    """The plain adapter, keeping a copy of every step's log-probs (before the search masks them)."""

    def __init__(self, model):
        super().__init__(model)
        self.steps: list[torch.Tensor] = []

    def decode(self, prev_tokens, encoder_out, incremental_state):
        lprobs, attn = super().decode(prev_tokens, encoder_out, incremental_state)
        self.steps.append(lprobs.clone())
        return lprobs, attn

    def rows(self) -> list[int]:
        return [s.size(0) for s in self.steps]


def assert_margin(recorded: list[torch.Tensor], k: int, margin: float = 2e-5) -> None:
    """Within every row, the k best log-probs are at least `margin` apart (no near-ties)."""
    for lprobs in recorded:
        top = lprobs.topk(min(k, lprobs.size(1)), dim=1).values  # (rows, k)
        gaps = top[:, :-1] - top[:, 1:]  # (rows, k-1)
        assert gaps.min().item() >= margin


def assert_same(a: list, b: list, rel: float = 1e-5) -> None:
    """Two searches' outputs: identical tokens, scores within `rel`, close per-token data."""
    assert len(a) == len(b)
    for hyps_a, hyps_b in zip(a, b):
        assert len(hyps_a) == len(hyps_b)
        for x, y in zip(hyps_a, hyps_b):
            assert torch.equal(x["tokens"], y["tokens"]), (x["tokens"], y["tokens"])
            assert math.isclose(x["score"], y["score"], rel_tol=rel), (x["score"], y["score"])
            torch.testing.assert_close(
                x["positional_scores"], y["positional_scores"], rtol=rel, atol=1e-5
            )
            if x["attention"] is None or y["attention"] is None:
                assert x["attention"] is None and y["attention"] is None
            else:
                torch.testing.assert_close(x["attention"], y["attention"], rtol=rel, atol=1e-6)


def assert_well_formed(hyps: list, nbest: int, lenpen: float = 1.0, normalize=True) -> None:
    """Each hypothesis ends in its only EOS; its score follows from its per-token scores."""
    for sent in hyps:
        assert len(sent) == nbest
        assert all(x["score"] >= y["score"] for x, y in zip(sent, sent[1:]))  # best first
        for h in sent:
            tokens = h["tokens"]
            assert tokens[-1] == EOS and (tokens[:-1] != EOS).all() and (tokens != PAD).all()
            assert h["positional_scores"].shape == tokens.shape
            total = h["positional_scores"].sum().item()
            expected = total / len(tokens) ** lenpen if normalize else total
            assert math.isclose(h["score"], expected, rel_tol=1e-5)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from threads; on a shared machine they only add waiting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- tensorized == reference

CASES = [
    dict(beam=1),
    dict(beam=2, lenpen=0.0, nbest=2),
    dict(beam=5),
    dict(beam=5, lenpen=2.0, nbest=3),
    dict(beam=2, unk_penalty=2.0, nbest=2),
    dict(beam=5, min_len=4, nbest=5),
    dict(beam=5, lenpen=0.0, unk_penalty=0.5, min_len=2, nbest=2, normalize_scores=False),
    dict(beam=2, lenpen=2.0, max_len_a=0.5, max_len_b=3),  # each sentence its own limit
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_tensorized_equals_reference(case):
    model = sharp_model()
    src, lengths = batch(LENGTHS)
    args = {"max_len_b": 15, **case}
    fast, slow = Recorder(model), Recorder(model)
    out = beam_search(fast, src, lengths, **args)
    ref = reference_beam_search(slow, src, lengths, **args)

    assert_margin(fast.steps + slow.steps, 2 * case["beam"] + 1)
    assert_same(out, ref)
    assert_well_formed(
        out, case.get("nbest", 1), case.get("lenpen", 1.0), case.get("normalize_scores", True)
    )
    # the same batch shrinking, step by step: sentences finished at different steps
    assert fast.rows() == slow.rows()
    assert len(set(fast.rows())) >= 2


def test_the_test_model_exercises_what_is_compared():
    """Without these, the comparisons above would prove less than they claim."""
    model = sharp_model()
    src, lengths = batch(LENGTHS)
    plain = beam_search(model, src, lengths, beam=5, max_len_b=15)
    lens = sorted({len(h[0]["tokens"]) for h in plain})
    assert len(lens) >= 3 and lens[0] < 16 and lens[-1] == 16  # varied; the limit reached too
    assert any(UNK in h[0]["tokens"].tolist() for h in plain)  # the unk penalty has work
    penalised = beam_search(model, src, lengths, beam=5, max_len_b=15, unk_penalty=100.0)
    assert not any(UNK in h[0]["tokens"].tolist() for h in penalised)
    late = beam_search(model, src, lengths, beam=5, max_len_b=15, min_len=4)
    assert all(len(h[0]["tokens"]) >= 5 for h in late)  # EOS forbidden at steps 0-3
    assert min(len(h[0]["tokens"]) for h in plain) < 5


# ---------------------------------------------------------------- beam 1 == greedy


@pytest.mark.parametrize("case", [dict(), dict(unk_penalty=1.0, min_len=3, lenpen=0.5)])
def test_beam_one_is_greedy(case):
    model = sharp_model(seed=1)
    src, lengths = batch(LENGTHS, seed=4)
    rec = Recorder(model)
    out = beam_search(rec, src, lengths, beam=1, max_len_b=15, **case)
    assert_margin(rec.steps, 3)
    ref = greedy(model, src, lengths, max_len_b=15, **case)
    assert_same(out, ref)
    assert len({len(h[0]["tokens"]) for h in out}) >= 3


# ---------------------------------------------------------------- batch invariance, lengths


def test_a_sentence_does_not_depend_on_its_batch():
    model = sharp_model(seed=2)
    src, lengths = batch(LENGTHS, seed=5)
    args = dict(beam=4, nbest=4, max_len_a=1.0, max_len_b=3)  # a > 0: limits differ per sentence
    mixed = beam_search(model, src, lengths, **args)
    for i, n in enumerate(LENGTHS):
        alone = beam_search(model, src[i : i + 1, -n:], lengths[i : i + 1], **args)  # no padding
        assert_same(mixed[i : i + 1], alone)
        assert mixed[i][0]["attention"].shape[0] == n  # padding columns removed
    # the same sentence among others in another order, with more padding
    order = [3, 0, 5]
    src2, _ = batch([LENGTHS[j] for j in order] + [15], seed=5)
    for row, j in enumerate(order):
        n = LENGTHS[j]
        src2[row] = PAD
        src2[row, -n:] = src[j, -n:]
    lengths2 = torch.tensor([LENGTHS[j] for j in order] + [15])
    other = beam_search(model, src2, lengths2, **args)
    for row, j in enumerate(order):
        assert_same(other[row : row + 1], mixed[j : j + 1])


def test_max_length_is_each_sentences_own():
    model = sharp_model(seed=2, eos_bias=-30.0)  # EOS never chosen: every output hits its limit
    src, lengths = batch(LENGTHS, seed=5)
    a, b = 0.5, 2
    for search in (beam_search, reference_beam_search):
        out = search(model, src, lengths, beam=3, nbest=3, max_len_a=a, max_len_b=b)
        for n, hyps in zip(LENGTHS, out):
            for h in hyps:  # int(a * src_len + b) tokens, then the forced EOS
                assert len(h["tokens"]) == int(a * n + b) + 1
                assert h["tokens"][-1] == EOS


def test_min_len_is_respected_exactly():
    model = sharp_model(eos_bias=30.0)  # EOS first whenever it is allowed
    src, lengths = batch(LENGTHS)
    for min_len in (0, 1, 4):
        for search in (beam_search, reference_beam_search, greedy):
            out = search(model, src, lengths, min_len=min_len, max_len_b=10)
            assert [len(h[0]["tokens"]) for h in out] == [max(min_len, 0) + 1] * len(LENGTHS)


def test_max_length_is_capped_by_the_models_positions():
    torch.manual_seed(0)
    model = FConvModel.build({**SMALL, "max_target_positions": 8}, V_SRC, V_TGT).eval()
    with torch.no_grad():
        model.decoder.fc3.bias[EOS] -= 30.0
    src, lengths = batch([4, 6])
    limit = model.max_positions()[1] - 1  # the decoder input at the last step holds EOS too
    for search in (beam_search, reference_beam_search, greedy):
        out = search(model, src, lengths, max_len_b=200)
        assert [len(h[0]["tokens"]) for h in out] == [limit + 1, limit + 1]


def test_min_len_above_the_maximum_is_refused():
    model = sharp_model()
    src, lengths = batch([3])
    with pytest.raises(ValueError, match="min_len"):
        beam_search(model, src, lengths, min_len=5, max_len_b=4)
    with pytest.raises(ValueError, match="nbest"):
        beam_search(model, src, lengths, beam=2, nbest=3)
    with pytest.raises(ValueError, match="src_lengths"):
        beam_search(model, src, torch.tensor([7]))


def test_empty_source_is_translated():
    model = sharp_model()
    src, lengths = batch([1, 5, 1])  # two sources that are just EOS
    for case in (dict(beam=1), dict(beam=3, nbest=2, min_len=2)):
        out = beam_search(model, src, lengths, max_len_b=10, **case)
        ref = reference_beam_search(model, src, lengths, max_len_b=10, **case)
        assert_same(out, ref)
        assert_well_formed(out, case.get("nbest", 1))
        for i in (0, 2):
            h = out[i][0]
            assert len(h["tokens"]) >= case.get("min_len", 1) + 1
            assert h["attention"].shape == (1, len(h["tokens"]))
            torch.testing.assert_close(h["attention"], torch.ones_like(h["attention"]))
    assert beam_search(model, src[:0], lengths[:0]) == []


# ---------------------------------------------------------------- the model and the fast paths


def test_search_leaves_a_training_model_untouched_and_ignores_dropout():
    model = sharp_model()
    src, lengths = batch(LENGTHS)
    expected = beam_search(model, src, lengths, beam=3, nbest=2, max_len_b=12)
    model.train()
    before = copy.deepcopy(model.state_dict())
    out = beam_search(model, src, lengths, beam=3, nbest=2, max_len_b=12)
    assert_same(out, expected)  # dropout off during the search
    assert model.training and all(m.training for m in model.modules())
    assert torch.is_grad_enabled()
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    conv = model.decoder.convolutions[0]
    assert conv.weight is not conv.weight  # weight norm is live again (nothing folded for good)
    assert model.decoder.attention[0].beam_size is None
    loss = model(src, lengths, torch.full((len(LENGTHS), 3), EOS))[0].sum()
    loss.backward()  # still trainable
    assert model.decoder.fc3.parametrizations.weight.original1.grad is not None


def test_the_cached_encoder_output_is_copied_only_when_the_batch_shrinks(monkeypatch):
    model = sharp_model()
    src, lengths = batch(LENGTHS)
    key, groups_key = model.decoder._cache_key, model.decoder._groups_key
    args = dict(beam=4, nbest=2, max_len_b=15)

    class Watch(IncrementalDecoderModel):
        def __init__(self, model, forget_groups=False):
            super().__init__(model)
            self.events: list[tuple[int, int, bool]] = []  # rows before, rows after, copied
            self.forget_groups = forget_groups

        def reorder_incremental_state(self, state, new_order):
            before = state[key]
            if self.forget_groups:
                state.pop(groups_key, None)
            super().reorder_incremental_state(state, new_order)
            self.events.append((before[0].size(0), new_order.numel(), state[key] is not before))

    watch = Watch(model)
    out = beam_search(watch, src, lengths, **args)
    assert all(copied == (old != new) for old, new, copied in watch.events)
    shrinks = sum(copied for *_, copied in watch.events)
    assert 1 <= shrinks < len(watch.events)
    # the same outputs, bit for bit, when the cache is copied at every step
    monkeypatch.setattr(
        decoder_module, "_equal_row_groups", lambda cached: torch.arange(cached[0].size(0))
    )
    always = Watch(model, forget_groups=True)
    copied = beam_search(always, src, lengths, **args)
    assert all(c for *_, c in always.events)
    for hyps_a, hyps_b in zip(out, copied, strict=True):
        for a, b in zip(hyps_a, hyps_b, strict=True):
            assert torch.equal(a["tokens"], b["tokens"]) and a["score"] == b["score"]
            assert torch.equal(a["positional_scores"], b["positional_scores"])
            assert torch.equal(a["attention"], b["attention"])


def test_history_rows_follow_their_parents_and_finished_rows_end_in_eos():
    history = History(6, 5, EOS, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    # the histories kept the slow way: Python lists per row
    tokens: list[list[int]] = [[EOS] for _ in range(6)]
    lprobs: list[list[float]] = [[] for _ in range(6)]
    attns: list[list[torch.Tensor]] = [[] for _ in range(6)]
    rows = 6
    for step, new_rows in enumerate([6, 6, 4, 4]):  # the batch shrinks after step 1
        assert history.tokens(rows, step).tolist() == tokens
        attn = torch.rand(rows, 3, generator=g)  # (rows, S)
        history.store_attention(attn, step)
        step_lprobs = torch.randn(rows, 10, generator=g)  # (rows, V)
        eos_lprobs = history.eos_lprobs(step_lprobs, EOS, step)
        assert torch.equal(eos_lprobs, step_lprobs[:, EOS])
        done = torch.tensor([rows - 1, 0, rows - 1])
        got_tokens, got_lprobs, got_attn = history.finished(done, step)
        for i, r in enumerate(done.tolist()):
            assert got_tokens[i].tolist() == tokens[r][1:] + [EOS]
            assert got_lprobs[i].tolist() == lprobs[r] + [step_lprobs[r, EOS].item()]
            assert torch.equal(got_attn[i], torch.stack(attns[r] + [attn[r]], dim=1))
        parents = torch.randint(0, rows, (new_rows,), generator=g)
        new_tokens = torch.randint(4, 10, (new_rows,), generator=g)
        new_lprobs = torch.randn(new_rows, generator=g)
        history.advance(parents, new_tokens, new_lprobs, step)
        tokens = [tokens[p] + [t] for p, t in zip(parents.tolist(), new_tokens.tolist())]
        lprobs = [lprobs[p] + [lp] for p, lp in zip(parents.tolist(), new_lprobs.tolist())]
        attns = [attns[p] + [attn[p]] for p in parents.tolist()]
        rows = new_rows


@pytest.mark.parametrize(
    "switch",
    [
        dict(shrink=False),
        dict(fold_weight_norm=False),
        dict(beamable_mm=False),
        dict(shrink=False, fold_weight_norm=False, beamable_mm=False),
    ],
)
def test_switching_optimisations_off_changes_no_output(switch):
    model = sharp_model()
    src, lengths = batch(LENGTHS)
    args = dict(beam=4, nbest=3, max_len_b=15)
    rec = Recorder(model)
    out = beam_search(rec, src, lengths, **args, **switch)
    assert_same(out, beam_search(model, src, lengths, **args))
    if switch.get("shrink") is False:
        assert set(rec.rows()) == {4 * len(LENGTHS)}  # the batch kept every row to the end


def test_without_attention():
    model = sharp_model()
    src, lengths = batch(LENGTHS)
    out = beam_search(model, src, lengths, beam=2, max_len_b=10, need_attn=False)
    with_attn = beam_search(model, src, lengths, beam=2, max_len_b=10)
    assert all(h[0]["attention"] is None for h in out)
    assert [h[0]["tokens"].tolist() for h in out] == [h[0]["tokens"].tolist() for h in with_attn]
    assert model.decoder.need_attn is True


def test_timer_sees_every_phase_and_costs_nothing_when_absent():
    model = sharp_model()
    src, lengths = batch(LENGTHS)
    for search in (beam_search, reference_beam_search):
        timer = PhaseTimer()
        search(model, src, lengths, beam=3, max_len_b=10, timer=timer)
        assert set(timer.seconds) == set(PHASES)
        assert timer.calls["encoder"] == 1
        steps = timer.calls["decoder"]
        assert 2 <= steps <= 11 and timer.calls["reorder"] >= steps - 1
        assert timer.total() == pytest.approx(sum(timer.seconds.values()))


def test_reference_and_greedy_import_nothing_from_the_tensorized_search():
    for name in ("reference.py", "greedy.py", "interface.py", "run.py", "timing.py"):
        tree = ast.parse((SEARCH_DIR / name).read_text())
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                modules.add(node.module or "")
                assert not any(a.name == "beam" or a.name == "beam_search" for a in node.names)
            elif isinstance(node, ast.Import):
                modules.update(a.name for a in node.names)
        assert not any(m.startswith("convseq.search.beam") for m in modules), name
        assert "convseq.search" not in modules, name  # the package re-exports beam_search
        internal = {m for m in modules if m.startswith("convseq")}
        # the special-token ids come from convseq.common, below every layer
        shared = {"convseq.search.interface", "convseq.search.run", "convseq.search.timing"}
        assert internal <= shared | {"convseq.common.specials"}, (name, internal)
