"""fp16 as fairseq users know it (trainer.precision=16-mixed), bf16 only where the device has it.

The CPU runs the bookkeeping: fp16 autocast with convseq's loss scaler, which here reports an
overflow at chosen updates (inf put into a gradient, as a real overflow would).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import pytorch_lightning as pl
import torch

from convseq.common.config import TrainerConfig
from convseq.errors import NonFiniteError
from convseq.tasks.train import train
from convseq.training import amp
from convseq.training.amp import LossScaler, PrecisionError, check_bf16, scale_window
from convseq.training.config import AmpConfig
from tests.training_utils import last_checkpoint, summary, tiny_config

FP16 = ["trainer.precision=16-mixed", "trainer.accelerator=cpu"]


def overflow_at(monkeypatch, steps: set[int]) -> list[int]:
    """Make the loss scaler find an inf in the gradients at these (1-based) optimizer steps."""
    calls = []
    unscale = LossScaler.unscale_

    def unscale_with_overflow(self, optimizer):
        unscale(self, optimizer)
        calls.append(len(calls) + 1)
        if calls[-1] in steps:
            state = self._per_optimizer_states[id(optimizer)]
            for found in state["found_inf_per_device"].values():
                found.fill_(1.0)
            grad = next(p.grad for g in optimizer.param_groups for p in g["params"])
            grad.view(-1)[0] = float("inf")

    monkeypatch.setattr(LossScaler, "unscale_", unscale_with_overflow)
    return calls


class Sentences(pl.Callback):
    """The number of sentences of every optimizer step's batch (one batch an update here)."""

    def __init__(self) -> None:
        self.per_step: list[int] = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.per_step.append(int(batch["target"].size(0)))


def test_updates_the_scaler_skips_count_nowhere(tiny_data, tmp_path, monkeypatch, one_thread):
    calls = overflow_at(monkeypatch, {2, 4})
    sentences = Sentences()
    cfg = tiny_config(
        tiny_data, tmp_path, *FP16, "max_update=6", "amp.scale_window=1000", "gen.test_bleu=false"
    )
    train(cfg, callbacks=[sentences])
    s = summary(tmp_path)
    assert len(calls) == 8  # 8 optimizer steps, 2 of them skipped ...
    assert (s["updates"], s["skipped_updates"]) == (6, 2)  # ... max_update=6 counts real ones
    assert "max_update=6" in s["stop_reason"]
    epoch = s["history"][0]
    assert epoch["updates"] == 6
    counted = [n for step, n in enumerate(sentences.per_step, start=1) if step not in {2, 4}]
    assert epoch["train_epoch/bsz"] * 6 == pytest.approx(sum(counted))  # skipped batches left out
    ckpt = last_checkpoint(tmp_path)
    assert ckpt["MixedPrecision"]["scale"] == 128.0 / 4  # amp.init_scale, halved twice
    assert ckpt["convseq"]["skipped_updates"] == 2  # a resumed run keeps counting


def test_a_loss_scale_below_the_floor_stops_training_with_a_clear_error(
    tiny_data, tmp_path, monkeypatch, one_thread
):
    overflow_at(monkeypatch, {1, 2})
    cfg = tiny_config(tiny_data, tmp_path, *FP16, "amp.init_scale=128", "amp.min_scale=64")
    with pytest.raises(NonFiniteError, match=r"loss scale fell to 32, below amp\.min_scale=64"):
        train(cfg)


def test_the_scale_window_defaults_to_fairseqs():
    assert scale_window(AmpConfig(), TrainerConfig(devices=1)) == 2**14
    four = TrainerConfig(devices=2, num_nodes=2, accumulate_grad_batches=4)
    assert scale_window(AmpConfig(), four) == 1024
    assert scale_window(AmpConfig(scale_window=100), TrainerConfig(devices=8)) == 100
    with pytest.raises(PrecisionError, match="amp.scale_window=0"):
        scale_window(AmpConfig(scale_window=0), TrainerConfig())


def fake_gpu(monkeypatch, capability: tuple[int, int], name: str) -> None:
    monkeypatch.setattr(amp.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(amp.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(amp.torch.cuda, "get_device_capability", lambda i=0: capability)
    monkeypatch.setattr(amp.torch.cuda, "get_device_name", lambda i=0: name)


def test_bf16_is_refused_on_a_gpu_without_bfloat16_naming_what_to_use(monkeypatch):
    fake_gpu(monkeypatch, (6, 1), "Tesla P40")
    trainer = TrainerConfig(accelerator="gpu", devices=1, precision="bf16-mixed")
    with pytest.raises(PrecisionError, match=r"Tesla P40 \(compute capability 6\.1\)") as e:
        check_bf16(trainer)
    assert "trainer.precision=16-mixed" in str(e.value)
    check_bf16(replace(trainer, precision="16-mixed"))  # fp16 is fine there
    fake_gpu(monkeypatch, (8, 0), "NVIDIA A100")
    check_bf16(trainer)  # Ampere has it


def test_16_mixed_below_capability_7_warns_with_the_fp32_advice(monkeypatch, caplog):
    trainer = TrainerConfig(accelerator="gpu", devices=1, precision="16-mixed")
    fake_gpu(monkeypatch, (6, 1), "Tesla P40")
    with caplog.at_level("WARNING", logger=amp.__name__):
        messages = amp.warn_fp16(trainer)
    assert len(messages) == 1 and "Tesla P40 (compute capability 6.1)" in messages[0]
    assert "trainer.precision=32-true" in messages[0] and messages[0] in caplog.text
    assert amp.warn_fp16(replace(trainer, precision="32-true")) == []  # fp32: nothing to say
    assert amp.warn_fp16(replace(trainer, accelerator="cpu")) == []  # no GPU in the run
    fake_gpu(monkeypatch, (7, 0), "Tesla V100")
    assert amp.warn_fp16(trainer) == []  # tensor cores from 7.0


def test_gen_bf16_is_judged_by_the_capability_of_the_device_in_use(monkeypatch):
    from convseq.inference import precision as gen_precision

    asked = []

    def capability(device=None):
        asked.append(device)
        return (8, 0) if torch.device(device).index == 0 else (7, 0)

    monkeypatch.setattr(gen_precision.torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(gen_precision.torch.cuda, "get_device_name", lambda d=None: "GPU X")
    # is_bf16_supported() would say yes (emulation, or the current device): not asked any more
    monkeypatch.setattr(gen_precision.torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    gen_precision.check_precision("bf16", "cuda:0")
    with pytest.raises(PrecisionError, match=r"GPU X \(cuda:1, compute capability 7\.0\)"):
        gen_precision.check_precision("bf16", "cuda:1")
    assert [torch.device(d).index for d in asked] == [0, 1]


def test_a_16_mixed_trainer_gets_the_configured_scaler(tiny_data, tmp_path):
    from convseq.training.build import build_trainer

    cfg = tiny_config(tiny_data, tmp_path, *FP16, "amp.init_scale=256", "amp.scale_window=50")
    trainer = build_trainer(cfg, [], tmp_path)
    scaler = trainer.precision_plugin.scaler
    assert isinstance(scaler, LossScaler)
    assert (scaler.get_scale(), scaler.get_growth_interval(), scaler.min_scale) == (256.0, 50, 1e-4)
    assert scaler.get_growth_factor() == 2.0 and scaler.get_backoff_factor() == 0.5


def test_bf16_on_a_cpu_needs_avx512_bf16(monkeypatch):
    trainer = TrainerConfig(accelerator="cpu", devices=1, precision="bf16-mixed")
    monkeypatch.setattr(amp, "cpu_has", lambda feature: False)
    with pytest.raises(PrecisionError, match="needs AVX-512 BF16") as e:
        check_bf16(trainer)
    assert "trainer.precision=32-true" in str(e.value)
    check_bf16(replace(trainer, precision="32-true"))  # fp32 always runs
    monkeypatch.setattr(amp, "cpu_has", lambda feature: feature == "bf16")
    check_bf16(trainer)  # a CPU with the instructions
