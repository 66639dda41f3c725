"""FConvModel's behaviour: initialisation, causality, padding, incremental decoding, fast paths."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import convseq.models.decoder as decoder_module
import convseq.models.encoder as encoder_module
from convseq.models.fconv import FConvModel

PAD, EOS = 1, 2
V_SRC, V_TGT = 50, 60

# covers every path: odd and even kernels, k = 1, channel changes (projections), a residual
# from two layers back, and decoder layers with and without attention
SMALL = dict(
    encoder_embed_dim=24,
    encoder_layers="[(32, 3)] + [(48, 4)] * 2 + [(48, 1), (32, 3, 2)]",
    decoder_embed_dim=24,
    decoder_layers="[(32, 3)] + [(48, 2)] * 2 + [(48, 1)] + [(32, 3, 2)]",
    decoder_out_embed_dim=20,
    decoder_attention=[True, False, True, True, False],
    dropout=0.2,
)


def small_model(seed: int = 0, **overrides) -> FConvModel:
    torch.manual_seed(seed)
    return FConvModel.build({**SMALL, **overrides}, V_SRC, V_TGT)


def left_padded(lengths: list[int], seed: int = 1) -> torch.Tensor:
    """A (B, max) source batch, left-padded, each row ending in EOS."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        row = torch.randint(4, V_SRC, (n,), generator=g)
        row[-1] = EOS
        rows.append(torch.cat([torch.full((max(lengths) - n,), PAD), row]))
    return torch.stack(rows)


def prefixes(batch: int, steps: int, seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    prev = torch.randint(4, V_TGT, (batch, steps), generator=g)
    prev[:, 0] = EOS
    return prev


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


# ---------------------------------------------------------------- initialisation


def _close(measured: float, expected: float) -> bool:
    return abs(measured / expected - 1.0) <= 0.01


def test_initialisation_follows_fairseqs_std_formulas():
    p = 0.2
    torch.manual_seed(0)
    # layers big enough (>= 262k weights) that a 1% band is > 5 standard errors wide
    model = FConvModel.build(
        dict(
            encoder_embed_dim=512,
            encoder_layers="[(512, 3)] * 2",
            decoder_embed_dim=512,
            decoder_layers="[(512, 3)]",
            decoder_out_embed_dim=512,
            dropout=p,
        ),
        1000,
        1000,
    )
    enc, dec = model.encoder, model.decoder
    expected = {
        "embed_tokens": (enc.embed_tokens.weight[2:], 0.1),
        "embed_positions": (dec.embed_positions.weight[2:], 0.1),
        "fc1 (fed by dropout)": (enc.fc1.weight, math.sqrt((1 - p) / 512)),
        "encoder conv": (enc.convolutions[0].weight, math.sqrt(4 * (1 - p) / (3 * 512))),
        "decoder conv": (dec.convolutions[0].weight, math.sqrt(4 * (1 - p) / (3 * 512))),
        "encoder fc2": (enc.fc2.weight, math.sqrt(1 / 512)),
        "attention in_projection": (dec.attention[0].in_projection.weight, math.sqrt(1 / 512)),
        "decoder fc3 (fed by dropout)": (dec.fc3.weight, math.sqrt((1 - p) / 512)),
    }
    for name, (weight, std) in expected.items():
        assert _close(weight.std().item(), std), name
        assert abs(weight.mean().item()) < 0.01 * std * 5, name
    # the band is tight enough to catch a missing factor
    conv_std = enc.convolutions[0].weight.std().item()
    assert not _close(conv_std, math.sqrt(4 / (3 * 512)))  # (1 - p) left out
    assert not _close(conv_std, math.sqrt((1 - p) / 512))  # 4/k left out
    assert not _close(enc.fc1.weight.std().item(), math.sqrt(1 / 512))  # (1 - p) left out
    # pad rows and biases are zero; g = ||v|| so the weight starts as drawn
    assert torch.equal(enc.embed_tokens.weight[PAD], torch.zeros(512))
    assert torch.equal(dec.embed_positions.weight[PAD], torch.zeros(512))
    assert torch.equal(dec.convolutions[0].bias, torch.zeros(1024))
    assert torch.equal(dec.fc3.bias, torch.zeros(1000))
    v = dec.fc3.parametrizations.weight.original1
    torch.testing.assert_close(dec.fc3.weight, v)


# ---------------------------------------------------------------- causality and padding


def test_decoder_is_causal():
    model = small_model().eval()
    src = left_padded([7, 9])
    prev = prefixes(2, 12)
    logits, _ = model(src, None, prev)
    changed = prev.clone()
    changed[:, 6:] = torch.randint(4, V_TGT, (2, 6))
    logits2, _ = model(src, None, changed)
    torch.testing.assert_close(logits2[:, :6], logits[:, :6], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(logits2[:, 6], logits[:, 6])  # the change is visible at step 6


def test_left_padding_changes_no_real_output():
    model = small_model().eval()
    batch = left_padded([6, 11, 9])  # the first row carries 5 pads
    alone = batch[:1, 5:]
    out_b = model.encoder(batch, None)
    out_a = model.encoder(alone, None)
    assert out_a["encoder_padding_mask"] is None
    assert torch.equal(out_b["encoder_padding_mask"][0], torch.arange(11) < 5)
    for tb, ta in zip(out_b["encoder_out"], out_a["encoder_out"], strict=True):
        torch.testing.assert_close(tb[0, 5:], ta[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(out_b["encoder_out"][0][0, :5], torch.zeros(5, 24))  # x zero at pads
    prev = prefixes(3, 8)
    prev[0, 6:] = PAD  # right-padded target rows
    logits_b, attn_b = model(batch, None, prev)
    logits_a, attn_a = model(alone, None, prev[:1])
    torch.testing.assert_close(logits_b[0], logits_a[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attn_b[0, :, 5:], attn_a[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(attn_b[0, :, :5], torch.zeros(8, 5))


# ---------------------------------------------------------------- incremental decoding


def _incremental(model, src, prev, events, beam_size=None, fold=False):
    """Decode prev step by step; `events` maps a step to a new_order applied before it.

    Returns per-step logits and, per step, which original row each current row is.
    """
    enc = model.encoder(src, None)
    state: dict = {}
    rows = torch.arange(src.size(0))
    history = prev
    outputs = []
    with model.generation_mode(beam_size=beam_size, fold_weight_norm=fold):
        for t in range(prev.size(1)):
            if t in events:
                order = events[t]
                model.reorder_incremental_state(state, order)
                enc = model.reorder_encoder_out(enc, order)
                rows, history = rows[order], history[order]
            logits, attn = model.decoder(history[:, : t + 1], enc, state)
            assert logits.shape == (rows.numel(), 1, V_TGT)
            assert attn.shape == (rows.numel(), 1, src.size(1))
            outputs.append((logits[:, 0], rows))
    return outputs


def test_incremental_equals_teacher_forced_with_reorder_and_shrink():
    model = small_model().eval()
    src = left_padded([7, 12, 9, 10])
    prev = prefixes(4, 24)
    full, _ = model(src, None, prev)  # one training-path call over the whole prefix
    events = {
        8: torch.tensor([2, 0, 3, 1]),  # a permutation
        14: torch.tensor([1, 1, 3, 0]),  # duplicate a row, drop one
        19: torch.tensor([3, 0]),  # shrink to fewer rows
    }
    steps = _incremental(model, src, prev, events)
    assert len(steps) == 24 and steps[-1][1].tolist() == [2, 0]
    worst = max(rel(logits, full[rows, t]) for t, (logits, rows) in enumerate(steps))
    assert worst <= 1e-5


def test_an_incremental_step_costs_one_position():
    model = small_model().eval()
    src, prev = left_padded([5, 6]), prefixes(2, 5)
    enc = model.encoder(src, None)
    state: dict = {}
    seen = []
    hook = model.decoder.convolutions[0].register_forward_hook(
        lambda m, args, out: seen.append(args[0].shape)
    )
    with torch.no_grad():
        for t in range(5):
            model.decoder(prev[:, : t + 1], enc, state)
    hook.remove()
    assert seen == [torch.Size([2, 1, 32])] * 5  # one frame per step, whatever the prefix


def test_generation_fast_paths_change_no_output():
    model = small_model().eval()
    beam, sentences = 4, 3
    src = left_padded([6, 9, 8]).repeat_interleave(beam, dim=0)  # (12, S) beam copies
    prev = prefixes(beam * sentences, 20)
    g = torch.Generator().manual_seed(5)

    def within_beams(n_sent):  # each row continues a row of its own sentence
        pick = torch.randint(0, beam, (n_sent, beam), generator=g)
        return (torch.arange(n_sent).unsqueeze(1) * beam + pick).flatten()

    events = {t: within_beams(3) for t in (3, 6, 9)}
    events[12] = torch.cat([torch.arange(0, 4), torch.arange(8, 12)])  # sentence 1 finished
    events.update({t: within_beams(2) for t in (15, 18)})
    plain = _incremental(model, src, prev, events)
    for beam_size, fold in ((beam, False), (None, True), (beam, True)):
        fast = _incremental(model, src, prev, events, beam_size=beam_size, fold=fold)
        for (a, rows_a), (b, rows_b) in zip(plain, fast, strict=True):
            assert torch.equal(rows_a, rows_b)
            assert rel(b, a) <= 1e-5
    # the full forward under folded weights matches too
    with model.generation_mode(fold_weight_norm=True):
        folded, _ = model(src, None, prev)
    unfolded, _ = model(src, None, prev)
    assert rel(folded, unfolded) <= 1e-5


def _decode_with_reorders(model, src, prev, events, forget_groups=False):
    """Incremental decoding with reorders; per step (logits, original rows), and per event
    whether the cached encoder output was copied (a new object) or left as it was.

    ``forget_groups`` drops the decoder's record of which rows hold equal copies before each
    reorder, so that it is found again from the values.
    """
    key = model.decoder._cache_key
    enc = model.encoder(src, None)
    state: dict = {}
    rows, history = torch.arange(src.size(0)), prev
    outputs, copied = [], []
    with torch.no_grad():
        for t in range(prev.size(1)):
            if t in events:
                order = events[t]
                before = state[key]
                if forget_groups:
                    state.pop(model.decoder._groups_key, None)
                model.reorder_incremental_state(state, order)
                enc = model.reorder_encoder_out(enc, order)
                copied.append(state[key] is not before)
                assert state[key][0].size(0) == order.numel()
                rows, history = rows[order], history[order]
            logits, _ = model.decoder(history[:, : t + 1], enc, state)
            outputs.append((logits[:, 0], rows))
    return outputs, copied


def test_the_cached_encoder_output_is_copied_only_when_a_row_changes_sentence(monkeypatch):
    model = small_model().eval()
    beam = 3
    src = left_padded([6, 9, 8]).repeat_interleave(beam, dim=0)  # (9, S): beam copies
    prev = prefixes(9, 14)
    g = torch.Generator().manual_seed(7)

    def within_beams(n_sent):  # each row continues a row of its own sentence (not in place)
        pick = torch.randint(0, beam, (n_sent, beam), generator=g)
        order = (torch.arange(n_sent).unsqueeze(1) * beam + pick).flatten()
        assert not torch.equal(order, torch.arange(n_sent * beam))
        return order

    events = {
        2: within_beams(3),
        4: within_beams(3),
        6: torch.cat([torch.arange(0, 3), torch.arange(6, 9)]),  # sentence 1 leaves: shrink
        8: within_beams(2),
        10: torch.tensor([3, 4, 5, 0, 1, 2]),  # the two sentences swap places: same size
        12: within_beams(2),
    }
    skipped, copied = _decode_with_reorders(model, src, prev, events)
    assert copied == [False, False, True, False, True, False]
    full, _ = model(src, None, prev)  # teacher forced: no cache at all
    worst = max(rel(logits, full[rows, t]) for t, (logits, rows) in enumerate(skipped))
    assert worst <= 1e-5
    # bit-identical to copying at every reorder (every row its own group)
    monkeypatch.setattr(
        decoder_module, "_equal_row_groups", lambda cached: torch.arange(cached[0].size(0))
    )
    always, copied = _decode_with_reorders(model, src, prev, events, forget_groups=True)
    assert copied == [True] * len(events)
    for (a, rows_a), (b, rows_b) in zip(skipped, always, strict=True):
        assert torch.equal(rows_a, rows_b) and torch.equal(a, b)


def test_rows_with_equal_cached_values_are_grouped_and_nan_rows_never_are():
    a, b = torch.randn(2, 4, 3), torch.randn(1, 4, 3)
    keys = torch.cat([a[:1], a[:1], b, a[:1], a[1:], a[1:]])  # rows 0,1 equal; 3 equals 0
    mask = torch.zeros(6, 3, dtype=torch.bool)
    mask[1, 0] = True  # ... but row 1's mask differs from row 0's
    groups = decoder_module._equal_row_groups((keys, keys.transpose(1, 2), mask)).tolist()
    # neighbours only: row 3 equals row 0 but is not next to it; rows 4 and 5 are equal
    assert groups == [1, 2, 3, 4, 5, 5]
    assert decoder_module._equal_row_groups((keys, None, None)).tolist() == [1, 1, 2, 3, 4, 4]
    keys[4:] = float("nan")  # NaN equals nothing: such rows are always copied
    assert decoder_module._equal_row_groups((keys, None, None)).tolist() == [1, 1, 2, 3, 4, 5]


def test_generation_mode_folds_weights_and_restores_everything():
    model = small_model()
    model.train()
    model.encoder.fc1.eval()  # a mixed train/eval state must come back as it was
    conv = model.decoder.convolutions[0]
    assert conv.weight is not conv.weight  # recomputed g * v / ||v|| at each access
    with model.generation_mode(beam_size=5, need_attn=False):
        assert conv.weight is conv.weight  # computed once: a plain folded weight
        assert not model.training and not torch.is_grad_enabled()
        assert model.decoder.attention[0].beam_size == 5
        assert model.decoder.need_attn is False
    assert conv.weight is not conv.weight
    assert model.training and not model.encoder.fc1.training and model.encoder.training
    assert model.decoder.attention[0].beam_size is None
    assert model.decoder.need_attn is True and torch.is_grad_enabled()


def _greedy(model, src, steps=6):
    with model.generation_mode(beam_size=1):
        enc = model.encoder(src, None)
        state: dict = {}
        tokens = torch.full((src.size(0), 1), EOS)
        for _ in range(steps):
            logits, _ = model.decoder(tokens, enc, state)
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens


def _train(model, batches, generate_after=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    torch.manual_seed(123)  # dropout masks
    for i, (src, prev) in enumerate(batches):
        logits, _ = model(src, None, prev)
        loss = F.cross_entropy(logits.reshape(-1, V_TGT), prev.roll(-1, dims=1).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i == generate_after:
            before = [p.detach().clone() for p in model.parameters()]
            _greedy(model, src)
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
            assert model.training


def test_generating_mid_training_leaves_training_bit_identical():
    batches = [(left_padded([5, 8, 7], seed=s), prefixes(3, 9, seed=s)) for s in range(6)]
    a = small_model()
    b = copy.deepcopy(a)
    _train(a, batches)
    _train(b, batches, generate_after=2)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    # and the run was not trivially static
    assert not torch.equal(a.decoder.fc3.bias, small_model().decoder.fc3.bias)


# ---------------------------------------------------------------- gradients, copies


def test_encoder_gradient_is_scaled_by_one_over_twice_the_attention_layers(monkeypatch):
    src, prev = left_padded([6, 8]), prefixes(2, 7)

    def grads():
        model = small_model(dropout=0.0)
        logits, _ = model(src, None, prev)
        logits.pow(2).mean().backward()
        return (
            model.encoder.fc2.parametrizations.weight.original1.grad.clone(),
            model.encoder.convolutions[0].bias.grad.clone(),
            model.encoder.embed_tokens.weight.grad.clone(),
            model.decoder.fc1.bias.grad.clone(),
        )

    scaled = grads()
    monkeypatch.setattr(encoder_module, "grad_multiply", lambda x, scale: x)
    plain = grads()
    factor = 1 / (2 * 3)  # three attention layers in SMALL
    torch.testing.assert_close(scaled[0], plain[0] * factor)  # reaches fc2 through x only
    torch.testing.assert_close(scaled[1], plain[1] * factor)
    # the embedding also feeds y directly (unscaled), so its gradient is not a plain multiple
    assert not torch.allclose(scaled[2], plain[2] * factor, rtol=1e-3, atol=1e-9)
    torch.testing.assert_close(scaled[3], plain[3])  # the decoder is untouched


def test_deepcopy_and_state_dict_round_trip():
    model = small_model(share_input_output_embed=True, decoder_out_embed_dim=24).eval()
    twin = copy.deepcopy(model)
    assert twin.decoder.fc3.weight is twin.decoder.embed_tokens.weight  # tie survives
    assert twin.decoder.fc3.weight is not model.decoder.fc3.weight
    other = small_model(seed=7, share_input_output_embed=True, decoder_out_embed_dim=24).eval()
    other.load_state_dict(model.state_dict(), strict=True)
    src, prev = left_padded([4, 6]), prefixes(2, 5)
    expected, _ = model(src, None, prev)
    for m in (twin, other):
        assert torch.equal(m(src, None, prev)[0], expected)


def test_normalized_probs_are_fp32_log_softmax():
    model = small_model().eval()
    net_output = model(left_padded([4, 6]), None, prefixes(2, 5))
    lprobs = model.get_normalized_probs((net_output[0].half(), None))
    assert lprobs.dtype == torch.float32
    torch.testing.assert_close(lprobs.exp().sum(-1), torch.ones(2, 5), rtol=1e-3, atol=1e-3)
    probs = model.get_normalized_probs(net_output, log_probs=False)
    torch.testing.assert_close(probs, net_output[0].softmax(-1))


def test_training_returns_no_attention_and_eval_averages_over_all_layers():
    model = small_model()
    src, prev = left_padded([4, 6]), prefixes(2, 5)
    assert model.train()(src, None, prev)[1] is None
    _, attn = model.eval()(src, None, prev)
    # 3 of 5 layers attend and fairseq divides by all 5: rows sum to 3/5
    torch.testing.assert_close(attn.sum(-1), torch.full((2, 5), 3 / 5))


def test_too_long_input_is_refused_clearly():
    model = small_model(max_source_positions=10)
    with pytest.raises(ValueError, match="exceeds the 8 positions"):
        model.encoder(torch.full((1, 9), 5), None)
