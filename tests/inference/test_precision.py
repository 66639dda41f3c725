"""gen.precision: bf16 and int8 copies of a model for generation, and their refusals."""

from __future__ import annotations

import json

import pytest
import torch
from torch.nn.utils import parametrize

import convseq.inference.precision as precision_mod
from convseq.common.config import TrainerConfig
from convseq.inference.generation import load_translator
from convseq.inference.precision import (
    Int8Linear,
    Int8LinearizedConvolution,
    PrecisionError,
    check_precision,
    for_generation,
)
from convseq.models.fconv import FConvModel
from convseq.modules.linearized_conv import LinearizedConvolution
from convseq.search import beam_search
from convseq.tasks.generate import run_generate
from tests.generation_utils import generate_config, tiny_checkpoint

HAS_BF16 = bool(torch.cpu._is_avx512_bf16_supported())
HAS_VNNI = bool(torch.cpu._is_vnni_supported())
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no AVX-512 BF16")
needs_vnni = pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX-512 VNNI")


def small_model(seed: int = 0) -> FConvModel:
    torch.manual_seed(seed)
    cfg = {
        "encoder_embed_dim": 32,
        "decoder_embed_dim": 32,
        "decoder_out_embed_dim": 32,
        "encoder_layers": [[32, 3]] * 2,
        "decoder_layers": [[32, 3]] * 2,
        "dropout": 0.0,
    }
    return FConvModel.build(cfg, 60, 70).eval()


def sources(n: int = 6, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 60, (n, 9), generator=g)  # (B, S), no padding
    src[:, -1] = 2  # EOS
    return src, torch.full((n,), 9)


@needs_vnni
def test_int8_linear_is_the_linear_map_within_quantisation_error():
    torch.manual_seed(0)
    w, b, x = torch.randn(48, 40), torch.randn(48), torch.randn(7, 3, 40)
    expected = x @ w.t() + b  # (7, 3, 48)
    got = Int8Linear(w, b)(x)
    assert got.shape == expected.shape and got.dtype == torch.float32
    # 8-bit weights and activations: about 1% of the output's scale
    assert (got - expected).abs().max() < 0.02 * expected.abs().max()
    assert not torch.equal(got, expected)  # it is int8 arithmetic, not the fp32 product


@needs_vnni
def test_int8_decoder_step_matches_the_fp32_step():
    conv = LinearizedConvolution(16, 24, 3)
    torch.manual_seed(3)
    steps = [torch.randn(5, 1, 16) for _ in range(4)]  # (B, 1, C_in) per step
    state_fp32: dict = {}
    want = [conv(x, state_fp32) for x in steps]
    q = Int8LinearizedConvolution(16, 24, 3)
    q.load_state_dict(conv.state_dict())
    q._state_key = conv._state_key
    q.quantize_step()
    state_int8: dict = {}
    for x, w in zip(steps, want, strict=True):
        got = q(x, state_int8)
        assert got.shape == w.shape == (5, 1, 24)
        assert (got - w).abs().max() < 0.03 * w.abs().max()


@pytest.mark.parametrize(
    "precision", [pytest.param("bf16", marks=needs_bf16), pytest.param("int8", marks=needs_vnni)]
)
def test_reduced_copy_leaves_the_model_alone_and_decodes_close_to_fp32(precision):
    model = small_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    reduced = for_generation(model, precision)
    assert reduced is not model
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)  # fp32 weights untouched
    assert parametrize.is_parametrized(model.decoder.fc2, "weight")  # weight norm still there
    assert not parametrize.is_parametrized(reduced.decoder.fc2, "weight")
    if precision == "bf16":
        assert reduced.decoder.fc2.weight.dtype == torch.bfloat16
    else:
        assert isinstance(reduced.decoder.fc3, Int8Linear)
        assert all(isinstance(c, Int8LinearizedConvolution) for c in reduced.decoder.convolutions)

    # one teacher-forced decoder pass: log-probs close, the same argmax almost everywhere
    src, lengths = sources()
    prev = torch.randint(4, 70, (6, 8), generator=torch.Generator().manual_seed(2))
    prev[:, 0] = 2
    with torch.no_grad():
        ref = model.get_normalized_probs(model(src, lengths, prev))  # (B, T, V) float32
        low = reduced.get_normalized_probs(reduced(src, lengths, prev))
    assert low.dtype == torch.float32
    assert (low - ref).abs().max() < 0.1
    agree = (low.argmax(-1) == ref.argmax(-1)).float().mean()
    assert agree > 0.9
    # and the search runs on it, one hypothesis list per sentence
    hyps = beam_search(reduced, src, lengths, beam=3, max_len_b=6)
    assert len(hyps) == 6 and all(h[0]["tokens"][-1] == 2 for h in hyps)


def test_fp32_is_the_model_itself():
    model = small_model()
    assert for_generation(model, "fp32") is model


def test_unsupported_precisions_are_refused(monkeypatch):
    with pytest.raises(
        PrecisionError, match="gen.precision='fp16': choose one of fp32, bf16, int8"
    ):
        check_precision("fp16")
    with pytest.raises(PrecisionError, match="int8 runs on the CPU only"):
        check_precision("int8", "cuda")
    monkeypatch.setattr(precision_mod, "cpu_has", lambda feature: False)
    with pytest.raises(PrecisionError, match="needs a CPU with AVX-512 BF16"):
        for_generation(small_model(), "bf16")
    with pytest.raises(PrecisionError, match="needs a CPU with AVX-512 VNNI"):
        for_generation(small_model(), "int8")
    check_precision("fp32")  # always runs


@needs_vnni
def test_gen_precision_reaches_task_generate(tiny_data, tmp_path_factory, tmp_path):
    ckpt = tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())
    cfg = generate_config(tiny_data, tmp_path, f"ckpt={ckpt}", "gen.precision=int8")
    translator = load_translator(cfg.ckpt, cfg.gen, cfg.trainer.accelerator)
    model = translator.models[0]
    assert isinstance(model.decoder.fc3, Int8Linear)
    assert translator.search_model.model is model  # the search runs the int8 copy
    run_generate(cfg)  # the whole task: the test split in int8, its figures say so
    result = json.loads((tmp_path / "generate-test.json").read_text())
    assert result["precision"] == "int8"
    refs = (tiny_data["corpus"] / "test.tgt").read_text(encoding="utf-8").splitlines()
    hyps = (tmp_path / "generate-test.txt").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == len(refs) == result["sentences"]
    cfg = generate_config(
        tiny_data, tmp_path, f"ckpt={ckpt}", "gen.precision=int8", "trainer.accelerator=gpu"
    )
    with pytest.raises(PrecisionError, match="int8 runs on the CPU only"):
        load_translator(cfg.ckpt, cfg.gen, cfg.trainer.accelerator)


def test_generation_runs_in_gen_precision_whatever_trainer_precision_says(monkeypatch):
    """A training setting (bf16-mixed autocast) must not slip under an fp32 generate run whose
    results file says fp32: the predict Trainer is always full precision."""
    from convseq.inference.generation import predict_trainer

    made = []
    monkeypatch.setattr(
        "convseq.inference.generation.pl.Trainer", lambda **kw: made.append(kw) or kw
    )
    predict_trainer(TrainerConfig(accelerator="cpu", devices=1, precision="bf16-mixed"))
    predict_trainer(TrainerConfig(accelerator="cpu", devices=1, precision="16-mixed"))
    assert [kw["precision"] for kw in made] == ["32-true", "32-true"]
