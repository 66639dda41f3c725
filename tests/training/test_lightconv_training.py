"""Training a LightConv / DynamicConv model: the unused-parameter probe DDP relies on, bit-exact
resume after a SIGTERM mid-epoch on 1 process and on 2 (gloo), `profile=true` (the straight
1-process run is profiled), and fp16 training (16-mixed) with convseq's loss scaler.

The machinery is fconv's, tested in test_ddp.py, test_ddp_unused.py, test_resume.py, test_ddp_resume.py and
test_profiler.py; here it runs a tiny LightConv (2 + 2 layers, width 16, kernels 3 and 5,
`model=lightconv_toy` shrunk) with dropout, so that the random stream matters on resume.

Bit-exact resume needs the convolutions' full forward to take the same form (band or unfold: they
round differently) in the resumed process as in the straight one. Outside training the form is
chosen by timing both, once per shape class and process (`convseq.modules.conv_windows`,
"measure"), so two processes may choose differently; a training run takes fairseq's length rule
in every process (`training_forms`), which these runs check by leaving the mode as it is: the
1-process resume measures its forms first in a fresh measure cache.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch import nn

from convseq.models.lightconv import LightConvModel
from convseq.modules.conv_windows import MEASURED, conv_form
from convseq.tasks.config import as_config
from convseq.training.unused_params import unused_parameters
from tests.search.test_lightconv_search import lightconv_config
from tests.training.lightconv_ddp_script import TINY_LIGHTCONV
from tests.training.test_resume import SendSignal, _deterministic
from tests.training_utils import (
    QUIET,
    last_checkpoint,
    launch_env,
    summary,
    tiny_corpus,
    train_one_thread,
)

# the LightConv of tiny runs, with dropout so that the random stream matters on resume
TINY = [*TINY_LIGHTCONV, "model.dropout=0.2"]
SCRIPT = Path(__file__).resolve().parent / "lightconv_ddp_script.py"


def lightconv_run_config(tiny: dict[str, Path], output_dir: Path, *overrides: str):
    """The typed config of a tiny LightConv run over the tiny corpus (300-token batches)."""
    from tests.conftest import compose_config

    base = [*tiny_corpus(tiny), "batching.max_tokens=300", *TINY, *QUIET]
    return as_config(compose_config([*base, *overrides], output_dir=str(output_dir)))


def assert_same_end(a: Path, b: Path) -> None:
    """Two runs with the same per-epoch figures, weights and optimiser state, bit for bit."""
    ha, hb = summary(a)["history"], summary(b)["history"]
    assert [_deterministic(h) for h in ha] == [_deterministic(h) for h in hb]
    ca, cb = last_checkpoint(a), last_checkpoint(b)
    assert ca["global_step"] == cb["global_step"]
    assert ca["state_dict"].keys() == cb["state_dict"].keys()
    for name, value in ca["state_dict"].items():
        assert torch.equal(value, cb["state_dict"][name]), name
    oa, ob = ca["optimizer_states"][0]["state"], cb["optimizer_states"][0]["state"]
    assert oa.keys() == ob.keys()
    for pid, state in oa.items():
        for key, value in state.items():
            assert torch.equal(value, ob[pid][key]), (pid, key)


# -- the unused-parameter probe (what ConvSeqDDPStrategy asks before wrapping the model) ---------
def test_the_probe_finds_every_lightconv_parameter_used_and_names_a_stray_one():
    torch.manual_seed(0)
    for conv_type in ("dynamic", "lightweight"):
        model = LightConvModel.build(lightconv_config(conv_type), 30, 40)
        assert unused_parameters(model) == []  # not None: the model could be probed
    model.decoder.stray = nn.Linear(4, 4)  # registered, never called
    assert unused_parameters(model) == ["decoder.stray.weight", "decoder.stray.bias"]


def test_the_probe_leaves_a_lightconv_models_gradients_mode_and_random_stream():
    torch.manual_seed(0)
    model = LightConvModel.build(lightconv_config("dynamic"), 30, 40)
    model.train()
    first = next(model.parameters())
    first.grad = torch.full_like(first, 3.0)
    rng = torch.get_rng_state()
    assert unused_parameters(model) == []
    assert model.training and all(m.training for m in model.modules())
    assert torch.equal(first.grad, torch.full_like(first, 3.0))
    assert all(p.grad is None for p in list(model.parameters())[1:])
    assert torch.equal(torch.get_rng_state(), rng)  # eval mode: no dropout drew from it


# -- one process: SIGTERM mid-epoch, then resume ---------------------------------------------------
def test_lightconv_sigterm_mid_epoch_then_resume_equals_a_straight_run(tiny_data, tmp_path):
    MEASURED.clear()  # as in a fresh process: a measured choice would be made anew
    with conv_form("measure"):  # the default outside training: train() must not use it
        sigterm_then_resume(tiny_data, tmp_path)
    assert not MEASURED  # nothing was timed: every full forward took the length rule


def sigterm_then_resume(tiny_data, tmp_path: Path) -> None:
    import signal

    setting = ["trainer.max_epochs=2", "gen.test_bleu=false"]
    straight = tmp_path / "straight"
    # profiled (profile=true), the other runs not: timing must not change what is computed
    train_one_thread(lightconv_run_config(tiny_data, straight, *setting, "profile=true"))
    assert summary(straight)["updates"] == 36  # 18 batches an epoch
    epochs = summary(straight)["profile"]["epochs"]
    assert len(epochs) == 2
    for epoch in epochs:
        for part in ("data", "forward", "backward", "optimiser"):
            assert 0 < epoch[part] < epoch["wall"], part

    cut = tmp_path / "cut"
    train_one_thread(
        lightconv_run_config(tiny_data, cut, *setting), [SendSignal(signal.SIGTERM, 25)]
    )
    first = summary(cut)
    assert first["interrupted"] and "SIGTERM" in first["stop_reason"]
    assert last_checkpoint(cut)["global_step"] == 26  # mid epoch 2
    train_one_thread(lightconv_run_config(tiny_data, cut, *setting, "resume=true"))
    assert_same_end(straight, cut)
    weights = last_checkpoint(cut)["state_dict"]
    assert any(".conv.weight_linear." in k for k in weights)  # it was a DynamicConv


# -- fp16 (trainer.precision=16-mixed): convseq's loss scaler, autocast on the CPU --------------
class OutputDtypes(pl.Callback):
    """The dtypes of the decoder's output projection in training (autocast makes them fp16)."""

    def __init__(self) -> None:
        self.dtypes: set[torch.dtype] = set()

    def on_train_start(self, trainer, module) -> None:
        projection = module.model.decoder.output_projection
        projection.register_forward_hook(lambda m, a, out: self.dtypes.add(out.dtype))


def test_lightconv_trains_in_16_mixed_with_the_loss_scaler(tiny_data, tmp_path):
    seen = OutputDtypes()
    fp16 = ["trainer.precision=16-mixed", "trainer.accelerator=cpu"]
    short = ["trainer.max_epochs=1", "trainer.limit_train_batches=6", "final_test=false"]
    cfg = lightconv_run_config(tiny_data, tmp_path, *fp16, *short, "gen.test_bleu=false")
    train_one_thread(cfg, [seen])
    result = summary(tmp_path)
    assert result["updates"] == 6 and result["skipped_updates"] == 0
    assert math.isfinite(result["history"][0]["train_epoch/loss"])
    assert torch.float16 in seen.dtypes  # the products ran in fp16
    weights = last_checkpoint(tmp_path)["state_dict"]
    assert all(v.dtype == torch.float32 for v in weights.values() if v.is_floating_point())


# -- two gloo processes: DDP trains a LightConv; SIGTERM mid-epoch, then resume ------------------
def ddp(tiny_data, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """tests/ddp_script.py's 2 gloo ranks on the tiny LightConv, two epochs."""
    record = out.with_name(out.name + "_record")
    settings = ["model.dropout=0.1", "trainer.max_epochs=2", "batching.max_tokens=150"]
    cmd = [sys.executable, str(SCRIPT), str(tiny_data["corpus"]), str(tiny_data["cache"])]
    cmd += [str(out), str(record), *settings, "final_test=false", *extra]
    env = launch_env()  # the default mode: training takes the length rule in every process
    proc = subprocess.run(cmd, cwd=out.parent, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


# slow: two processes each. The default run covers DDP's SIGTERM and bit-exact resume with
# fconv (test_ddp_resume.py through tests/ddp_script.py), DDP with unused parameters (test_ddp.py
# for the machinery, the probe tests above for LightConv) and the model's part in-process
# (tests/search/test_lightconv_search.py, the probe tests above)
@pytest.mark.slow
def test_ddp_trains_lightconv_and_resumes_bit_exactly_after_a_sigterm(tiny_data, tmp_path):
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    proc = ddp(tiny_data, straight)
    printed = proc.stdout + proc.stderr
    assert "find_unused_parameters on" not in printed  # the probe found every parameter used
    ranks = [
        torch.load(tmp_path / "straight_record" / f"rank{r}.pt", weights_only=True) for r in (0, 1)
    ]
    assert [r["world"] for r in ranks] == [2, 2]
    assert ranks[0]["strategy"] == "ConvSeqDDPStrategy"
    for name, value in ranks[0]["after_first_update"].items():  # one model on both ranks
        assert torch.equal(value, ranks[1]["after_first_update"][name]), name
    assert not torch.equal(
        ranks[0]["init"]["decoder.output_projection.weight"],
        ranks[0]["after_first_update"]["decoder.output_projection.weight"],
    )
    per_epoch = json.loads((straight / "summary.json").read_text())["history"][0]["updates"]
    cut_at = per_epoch + 3  # in the middle of epoch 2
    ddp(tiny_data, cut, f"sigterm_at_step={cut_at}")
    interrupted = json.loads((cut / "summary.json").read_text())
    assert interrupted["interrupted"] and interrupted["updates"] == cut_at + 1
    ddp(tiny_data, cut, "resume=true")

    a = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(cut / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 2 * per_epoch
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for name, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][name]), name
    states = b["callbacks"]["RNGStateCallback"]["per_rank"]
    assert len(states) == 2 and not torch.equal(states[0]["torch"], states[1]["torch"])
