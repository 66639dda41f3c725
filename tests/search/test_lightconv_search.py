"""The searches on LightConv / DynamicConv models: the tensorized beam search (incremental state,
reordered on beam moves) against the same search over the full forward, the reference search,
greedy decoding, and ensembles.

The fconv versions of these checks are in test_search.py; its helpers (source batches, the
recording adapter, the margin and equality checks) are reused. The models are tiny (2 + 2
layers, width 16, kernels 3 and 5) with random weights, the output projection scaled up so
candidates never tie, and EOS made likely so that sentences finish at different steps.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from convseq.inference.ensemble import EnsembleModel
from convseq.models.lightconv import LightConvModel
from convseq.models.lightconv_config import LightConvConfig
from convseq.modules.dynamic_conv import DynamicConv1dTBC
from convseq.search import IncrementalDecoderModel, beam_search, greedy, reference_beam_search
from tests.search.test_search import (
    EOS,
    LENGTHS,
    V_SRC,
    V_TGT,
    Recorder,
    assert_margin,
    assert_same,
    assert_well_formed,
    batch,
    one_thread,  # noqa: F401 (autouse: one intra-op thread for these tiny models)
    sharp_model,
)

CONV_TYPES = ("dynamic", "lightweight")


def lightconv_config(conv_type: str) -> LightConvConfig:
    return LightConvConfig(
        encoder_embed_dim=16, encoder_ffn_embed_dim=24, encoder_layers=2,
        encoder_attention_heads=2, encoder_kernel_size_list=(3, 5), decoder_layers=2,
        decoder_attention_heads=2, decoder_kernel_size_list=(3, 5), encoder_conv_type=conv_type,
        decoder_conv_type=conv_type, max_source_positions=64, max_target_positions=64,
    )  # fmt: skip


EOS_BIAS = {"dynamic": 5.0, "lightweight": 3.0}  # sentences end at varied steps, some at the limit


def sharp_lightconv(conv_type: str, seed: int = 0, scale: float = 4.0):
    """A random LightConv model with spread-out logits and EOS made likely.

    The decoder ends in its last layer's layer norm: its bias, moved along the EOS row of the
    output projection, raises EOS's logit by ``eos_bias`` (others by their overlap with it).
    """
    torch.manual_seed(seed)
    model = LightConvModel.build(lightconv_config(conv_type), V_SRC, V_TGT)
    with torch.no_grad():
        out = model.decoder.output_projection.weight  # (V, E)
        out.mul_(scale)
        eos_row = out[EOS]
        shift = EOS_BIAS[conv_type] * eos_row / eos_row.dot(eos_row)  # (E,)
        model.decoder.layers[-1].final_layer_norm.bias += shift
    return model.eval()


class FullForward(Recorder):
    """A search model without incremental state: every step reruns the decoder over the whole
    prefix (the rows the search reordered), and reordering has nothing to move."""

    def decode(self, prev_tokens, encoder_out, incremental_state):
        return super().decode(prev_tokens, encoder_out, None)

    def reorder_incremental_state(self, incremental_state, new_order):
        pass


CASES = [
    dict(beam=5, nbest=2),
    dict(beam=3, lenpen=0.5, unk_penalty=1.0, min_len=2, nbest=3),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("conv_type", CONV_TYPES)
def test_incremental_beam_search_equals_full_forward_and_reference(conv_type, case):
    model = sharp_lightconv(conv_type, seed=3)
    src, lengths = batch(LENGTHS)
    args = {"max_len_b": 15, **case}
    fast, full, slow = Recorder(model), FullForward(model), Recorder(model)
    out = beam_search(fast, src, lengths, **args)
    without_state = beam_search(full, src, lengths, **args)
    ref = reference_beam_search(slow, src, lengths, **args)

    assert_margin(fast.steps + full.steps + slow.steps, 2 * case["beam"] + 1)
    assert_same(out, without_state)
    assert_same(out, ref)
    assert_well_formed(out, case["nbest"], case.get("lenpen", 1.0))
    # sentences finished at different steps: the batch shrank, the cache was reordered
    assert fast.rows() == full.rows() == slow.rows()
    assert len(set(fast.rows())) >= 3


def test_a_search_decodes_the_dynamic_kernels_untrimmed_and_restores_them(monkeypatch):
    """The full forward over a prefix shorter than a kernel trims the dynamic kernels as fairseq's
    teacher forcing does (docs/model.md, T < K); fairseq's generation, and the incremental
    decoder, do not. A search therefore decodes untrimmed, so that greedy decoding and the
    full-forward search above see what the beam search sees."""
    model = sharp_lightconv("dynamic")
    src, lengths = batch(LENGTHS)
    convs = [m for m in model.modules() if isinstance(m, DynamicConv1dTBC)]
    assert convs and all(c.trim_short_kernel for c in convs)
    prev = torch.full((len(LENGTHS), 1), EOS)
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        trimmed = model.decoder(prev, enc)[0]  # (B, 1, V): teacher forcing, T = 1 < K
        incremental = model.decoder(prev, enc, {})[0]
        with model.generation_mode():
            assert not any(c.trim_short_kernel for c in convs)
            untrimmed = model.decoder(prev, enc)[0]
    assert all(c.trim_short_kernel for c in convs)  # restored
    torch.testing.assert_close(untrimmed, incremental, atol=1e-5, rtol=1e-5)
    assert (trimmed - incremental).abs().max() > 0.1  # what the search would otherwise see

    # greedy decoding (the full forward at every step) is beam 1 only because of it
    args = dict(max_len_b=15)
    beam_one = beam_search(model, src, lengths, beam=1, **args)
    assert_same(greedy(model, src, lengths, **args), beam_one)
    monkeypatch.setattr(model, "untrimmed_kernels", contextlib.nullcontext)
    trimmed_greedy = greedy(model, src, lengths, **args)
    assert [h[0]["tokens"].tolist() for h in trimmed_greedy] != [
        h[0]["tokens"].tolist() for h in beam_one
    ]


@pytest.mark.parametrize("conv_type", CONV_TYPES)
def test_beam_one_is_greedy(conv_type):
    model = sharp_lightconv(conv_type, seed={"dynamic": 1, "lightweight": 3}[conv_type])
    src, lengths = batch(LENGTHS, seed=4)
    rec = Recorder(model)
    args = dict(max_len_b=15, unk_penalty=0.5, min_len=2)
    out = beam_search(rec, src, lengths, beam=1, **args)
    assert_margin(rec.steps, 3)
    assert_same(out, greedy(model, src, lengths, **args))
    assert len({len(h[0]["tokens"]) for h in out}) >= 3


@pytest.mark.parametrize("conv_type", CONV_TYPES)
def test_an_ensemble_of_a_model_with_itself_is_the_model(conv_type):
    model = sharp_lightconv(conv_type)
    src, lengths = batch(LENGTHS)
    args = dict(beam=4, nbest=2, max_len_b=15)
    alone = beam_search(model, src, lengths, **args)
    twice = EnsembleModel([model, model])  # one module twice: each member keeps its own cache
    assert_same(beam_search(twice, src, lengths, **args), alone)
    assert_same(reference_beam_search(twice, src, lengths, **args), alone)


def test_an_ensemble_of_both_families_searches_like_its_reference():
    """fconv and LightConv over the same dictionaries: one ensemble, averaged per step; the
    tensorized search and the reference search agree on it, and it differs from either member."""
    light, fconv = sharp_lightconv("dynamic"), sharp_model()
    src, lengths = batch(LENGTHS)
    args = dict(beam=4, nbest=2, max_len_b=15)
    both = EnsembleModel([light, fconv])
    rec_fast, rec_ref = Recorder(light), Recorder(light)
    out = beam_search(EnsembleModel([rec_fast, fconv]), src, lengths, **args)
    ref = reference_beam_search(EnsembleModel([rec_ref, fconv]), src, lengths, **args)
    assert_same(out, ref)
    assert_same(beam_search(both, src, lengths, **args), out)
    assert rec_fast.rows() == rec_ref.rows()
    tokens = [h[0]["tokens"].tolist() for h in out]
    for member in (light, fconv):
        alone = beam_search(member, src, lengths, **args)
        assert tokens != [h[0]["tokens"].tolist() for h in alone]


def test_search_leaves_a_training_lightconv_model_as_it_was():
    model = sharp_lightconv("dynamic")
    src, lengths = batch(LENGTHS)
    expected = beam_search(model, src, lengths, beam=3, max_len_b=12)
    model.train()
    need_attn = model.decoder.need_attn
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = beam_search(model, src, lengths, beam=3, max_len_b=12, need_attn=False)
    assert [h[0]["tokens"].tolist() for h in out] == [h[0]["tokens"].tolist() for h in expected]
    assert all(h[0]["attention"] is None for h in out)
    assert all(h[0]["attention"] is not None for h in expected)
    assert model.training and all(m.training for m in model.modules())
    assert model.decoder.need_attn == need_attn
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert isinstance(IncrementalDecoderModel(model).max_target_positions(), int)
