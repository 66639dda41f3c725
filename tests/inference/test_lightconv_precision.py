"""gen.precision on LightConv / DynamicConv models: bf16 and int8 copies for generation.

The fconv checks, and the refusals where a CPU lacks the instructions, are in
test_precision.py (task=generate's gen.precision path included); here the same copies of tiny
LightConv models (2 + 2 layers, width 16) against their fp32 originals.

Tolerances, stated once: teacher-forced log-probabilities within 0.1 of fp32 (8-bit weights and
activations, or bf16's 8-bit mantissa, on logits of a few units), the same argmax at >= 90% of
the positions, and the beam search's best hypothesis identical to fp32's for at least half of
the sentences (a close second candidate may swap, and everything after it changes).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import convseq.inference.precision as precision_mod
from convseq.inference.precision import Int8Linear, for_generation
from convseq.models.lightconv import LightConvModel
from convseq.modules.dynamic_conv import DynamicConv1dTBC
from convseq.modules.lightweight_conv import LightweightConv1dTBC
from convseq.search import beam_search
from tests.inference.test_precision import needs_vnni
from tests.search.test_lightconv_search import LENGTHS, V_SRC, V_TGT, batch, lightconv_config


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def bf16_anywhere(monkeypatch):
    """bf16 on a CPU without AVX-512 BF16 too: `check_precision` refuses it there because it
    would be slow (emulated), not wrong, and what is checked here is the numbers."""
    monkeypatch.setattr(precision_mod, "cpu_has", lambda feature: True)


def model(conv_type: str) -> LightConvModel:
    torch.manual_seed(0)
    return LightConvModel.build(lightconv_config(conv_type), V_SRC, V_TGT).eval()


@pytest.mark.parametrize("conv_type", ["dynamic", "lightweight"])
@pytest.mark.parametrize("precision", [pytest.param("int8", marks=needs_vnni), "bf16"])
def test_reduced_lightconv_decodes_close_to_fp32(conv_type, precision, request):
    if precision == "bf16":
        request.getfixturevalue("bf16_anywhere")
    fp32 = model(conv_type)
    before = {k: v.clone() for k, v in fp32.state_dict().items()}
    reduced = for_generation(fp32, precision)
    assert reduced is not fp32
    assert all(torch.equal(v, fp32.state_dict()[k]) for k, v in before.items())  # untouched
    assert all(p.dtype == torch.float32 for p in fp32.parameters())
    if precision == "int8":
        assert not any(type(m) is nn.Linear for m in reduced.modules())  # every one swapped
        convs = [m for m in reduced.modules() if isinstance(m, DynamicConv1dTBC)]
        assert all(isinstance(c.weight_linear, Int8Linear) for c in convs)  # kernel predictors
        assert isinstance(reduced.decoder.output_projection, Int8Linear)
        for c in reduced.modules():  # lightweight kernels are (H, 1, K) parameters: kept fp32
            if isinstance(c, LightweightConv1dTBC):
                assert c.weight.dtype == torch.float32
    else:
        assert all(p.dtype == torch.bfloat16 for p in reduced.parameters())
        assert all(b.dtype == torch.bfloat16 for b in reduced.buffers() if b.is_floating_point())

    src, lengths = batch(LENGTHS)
    prev = torch.randint(4, V_TGT, (len(LENGTHS), 8), generator=torch.Generator().manual_seed(2))
    prev[:, 0] = 2
    with torch.no_grad():
        ref = fp32.get_normalized_probs(fp32(src, lengths, prev))  # (B, T, V)
        low = reduced.get_normalized_probs(reduced(src, lengths, prev))
    assert low.dtype == torch.float32
    assert (low - ref).abs().max() < 0.1
    assert not torch.equal(low, ref)  # reduced arithmetic, not the fp32 model again
    assert (low.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9

    args = dict(beam=4, max_len_b=15)
    want = beam_search(fp32, src, lengths, **args)
    got = beam_search(reduced, src, lengths, **args)
    assert all(h[0]["tokens"][-1] == 2 for h in got)
    same = sum(torch.equal(a[0]["tokens"], b[0]["tokens"]) for a, b in zip(got, want, strict=True))
    assert same >= len(LENGTHS) // 2
