"""Parameters without a gradient under DDP: found at setup, and DDP told about them.

`model.decoder_attention=false` leaves the encoder's output unused, so none of the encoder's
parameters gets a gradient; PyTorch's DDP, not told, fails at the second step. Two gloo ranks
training such a model: tests/training/test_ddp.py's second run (one launch with its first).
"""

from __future__ import annotations

import subprocess

import pytest
import torch

from convseq.models.fconv import FConvModel
from convseq.training.unused_params import unused_parameters
from tests.training_utils import ddp_script_command, launch_env

TINY = {
    "encoder_embed_dim": 16,
    "decoder_embed_dim": 16,
    "decoder_out_embed_dim": 16,
    "encoder_layers": [[16, 3]],
    "decoder_layers": [[16, 3], [16, 3]],
}


def test_the_probe_names_the_encoders_parameters_when_no_layer_attends():
    torch.manual_seed(0)
    attending = FConvModel.build(TINY, 30, 40)
    assert unused_parameters(attending) == []
    blind = FConvModel.build({**TINY, "decoder_attention": False}, 30, 40)
    encoder = {f"encoder.{n}" for n, _ in blind.encoder.named_parameters()}
    assert set(unused_parameters(blind)) == encoder and encoder
    one = FConvModel.build({**TINY, "decoder_attention": [False, True]}, 30, 40)
    assert unused_parameters(one) == []


def test_the_probe_leaves_gradients_mode_and_random_stream_as_they_were():
    model = FConvModel.build(TINY, 30, 40)
    model.train()
    first = next(model.parameters())
    first.grad = torch.full_like(first, 3.0)
    rng = torch.get_rng_state()
    unused_parameters(model)
    assert model.training
    assert torch.equal(first.grad, torch.full_like(first, 3.0))
    assert all(p.grad is None for p in list(model.parameters())[1:])
    assert torch.equal(torch.get_rng_state(), rng)


def _ddp(tmp_path, tiny_data, *options: str) -> tuple[subprocess.CompletedProcess, object]:
    work = tmp_path / "work"
    cmd = ddp_script_command(
        tiny_data,
        work / "out",
        work / "record",
        "model.decoder_attention=false",
        "trainer.limit_train_batches=4",
        "final_test=false",
        *options,
    )
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=launch_env(), capture_output=True, text=True, timeout=300
    )
    return proc, work


@pytest.mark.slow
def test_asking_ddp_not_to_look_for_them_is_refused_at_setup(tmp_path, tiny_data):
    proc, _ = _ddp(tmp_path, tiny_data, "trainer.strategy=ddp_find_unused_parameters_false")
    assert proc.returncode != 0
    assert "ddp_find_unused_parameters_false" in proc.stderr
    assert "get no gradient in this model (encoder." in proc.stderr
