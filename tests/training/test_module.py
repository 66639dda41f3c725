"""ConvSeqModule: fairseq's gradient normalisation, dummy batches, and checkpoints that load alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from convseq.checkpoints.io import load_checkpoint
from convseq.data.dataset import LanguagePairDataset
from convseq.errors import CheckpointError
from convseq.tasks.train import train
from convseq.training.module import ConvSeqModule
from tests.conftest import ROOT
from tests.training_utils import tiny_config, tiny_databin

MODEL = {
    "encoder_embed_dim": 16,
    "decoder_embed_dim": 16,
    "decoder_out_embed_dim": 16,
    "encoder_layers": [[16, 3]],
    "decoder_layers": [[16, 3]],
    "dropout": 0.0,
}


class GradProbe(ConvSeqModule):
    """Records the gradients the optimiser would see (normalised, before clipping)."""

    def configure_gradient_clipping(
        self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ):
        self.seen = {n: p.grad.detach().clone() for n, p in self.model.named_parameters()}
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)


class Batches(Dataset):
    """Pre-collated batches, served one by one (DataLoader(batch_size=None))."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, i):
        return self.batches[i]


def _module(tiny, normalize="tokens", cls=ConvSeqModule) -> ConvSeqModule:
    db = tiny_databin(tiny)
    torch.manual_seed(0)
    return cls(
        model=MODEL,
        src_vocab=db.src_dict.to_list(),
        tgt_vocab=db.tgt_dict.to_list(),
        optim={"name": "sgd", "lr": 1.0, "momentum": 0.0, "clip_norm": 0.0},
        criterion={"label_smoothing": 0.1, "normalize": normalize},
    )


def _batches(tiny, *index_lists):
    src, tgt = tiny_databin(tiny).split("train")
    ds = LanguagePairDataset(src, tgt)
    return [ds.collater([ds[i] for i in idx]) for idx in index_lists]


def _one_update(
    module: GradProbe, batches: list[dict], accumulate: int, clip: float | None = None
) -> dict[str, torch.Tensor]:
    trainer = pl.Trainer(
        accelerator="cpu",
        gradient_clip_val=clip,
        gradient_clip_algorithm="norm",
        max_steps=1,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        use_distributed_sampler=False,
    )
    trainer.fit(module, train_dataloaders=DataLoader(Batches(batches), batch_size=None))
    return module.seen


def _by_hand(module: ConvSeqModule, batches: list[dict], normalize: str) -> dict[str, torch.Tensor]:
    """Sum of the summed losses' gradients over all batches, divided by the total sample size."""
    module.zero_grad()
    total, size = 0.0, 0
    for b in batches:
        logits, _ = module.model(**b["net_input"])
        out = module.criterion(logits, b["target"])
        total = total + out.loss
        size += int(out.ntokens) if normalize == "tokens" else out.nsentences
    (total / size).backward()
    return {n: p.grad.detach().clone() for n, p in module.model.named_parameters()}


@pytest.mark.parametrize("normalize", ["tokens", "sentences"])
def test_two_accumulated_micro_batches_give_the_gradient_of_one_batch(
    tiny_data, one_thread, normalize
):
    small, large = [0, 1, 2], [3, 4, 5, 6, 7, 8, 9]
    b1, b2, both = _batches(tiny_data, small, large, small + large)
    assert b1["ntokens"] != b2["ntokens"] and b1["nsentences"] != b2["nsentences"]

    reference = _by_hand(_module(tiny_data, normalize), [b1, b2], normalize)
    accumulated = _one_update(_module(tiny_data, normalize, GradProbe), [b1, b2], accumulate=2)
    single = _one_update(_module(tiny_data, normalize, GradProbe), [both], accumulate=1)
    for name, ref in reference.items():
        torch.testing.assert_close(accumulated[name], ref, atol=1e-6, rtol=0, msg=name)
        torch.testing.assert_close(single[name], ref, atol=1e-6, rtol=0, msg=name)

    # Lightning alone (the mean of the two micro-batches' per-token means) is measurably off.
    m1, m2 = (
        _by_hand(_module(tiny_data), [b1], normalize),
        _by_hand(_module(tiny_data), [b2], normalize),
    )
    worst = max((0.5 * (m1[n] + m2[n]) - ref).abs().max().item() for n, ref in reference.items())
    assert worst > 1e-4


def test_a_dummy_batch_adds_nothing_to_the_update(tiny_data, one_thread):
    b1, b2 = _batches(tiny_data, [0, 1, 2], [3, 4, 5, 6])
    dummy = {**b2, "is_dummy": True, "ntokens": 0, "nsentences": 0}
    reference = _by_hand(_module(tiny_data), [b1], "tokens")
    seen = _one_update(_module(tiny_data, cls=GradProbe), [b1, dummy], accumulate=2)
    for name, ref in reference.items():
        torch.testing.assert_close(seen[name], ref, atol=1e-6, rtol=0, msg=name)


def test_trainer_clips_the_normalised_gradient_and_records_its_norm(tiny_data, one_thread):
    (b1,) = _batches(tiny_data, [0, 1, 2, 3])
    reference = _by_hand(_module(tiny_data), [b1], "tokens")
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in reference.values()])).item()
    assert norm > 0.01  # clipping has something to do

    module = _module(tiny_data, cls=GradProbe)  # plain SGD, lr 1: the step is minus the gradient
    before = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    _one_update(module, [b1], accumulate=1, clip=0.01)
    assert module._gnorm.item() == pytest.approx(norm, rel=1e-5)  # logged before clipping
    assert module._clipped.item() == 1.0
    scale = 0.01 / (norm + 1e-6)  # fairseq's and torch's clip coefficient
    for name, p in module.model.named_parameters():
        step = before[name] - p.detach()
        torch.testing.assert_close(step, reference[name] * scale, atol=1e-6, rtol=0, msg=name)


# -- checkpoints ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained_run(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("trained")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(tiny_config(tiny_data, out, "trainer.max_epochs=1", "model.dropout=0.2"))
    finally:
        torch.set_num_threads(before)
    return out


LOAD_SCRIPT = """
import json, sys, torch
from convseq.training.module import ConvSeqModule
m = ConvSeqModule.load_from_checkpoint(sys.argv[1], map_location="cpu", weights_only=True)
m.eval()
src = torch.tensor([[4, 5, 6, 7, 2]])
prev = torch.tensor([[2, 8, 9, 10]])
with torch.no_grad():
    logits, _ = m(src, torch.tensor([5]), prev)
print(json.dumps({"src": m.src_dict.to_list(), "tgt": m.tgt_dict.to_list(),
                  "logits": logits.double().flatten().tolist(), "arch": m.hparams.model["arch"]}))
"""


def test_load_from_checkpoint_in_a_fresh_process_with_weights_only(trained_run, tmp_path):
    alone = tmp_path / "alone"
    alone.mkdir()
    ckpt = alone / "model.ckpt"
    shutil.copy(trained_run / "checkpoints" / "last.ckpt", ckpt)
    env = {
        **os.environ,
        "CONVSEQ_CACHE": str(tmp_path / "no-cache"),
        "CONVSEQ_DATA_ROOT": str(tmp_path / "no-data"),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT / "src"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_SCRIPT, str(ckpt)],
        cwd=alone,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])

    raw = torch.load(ckpt, weights_only=True)
    expected = ConvSeqModule(**raw["hyper_parameters"])
    expected.load_state_dict(raw["state_dict"])
    expected.eval()
    with torch.no_grad():
        logits, _ = expected(
            torch.tensor([[4, 5, 6, 7, 2]]), torch.tensor([5]), torch.tensor([[2, 8, 9, 10]])
        )
    assert got["src"] == raw["hyper_parameters"]["src_vocab"] and got["tgt"][:4] == [
        "<s>",
        "<pad>",
        "</s>",
        "<unk>",
    ]
    assert got["arch"] == "fconv_toy"
    torch.testing.assert_close(
        torch.tensor(got["logits"], dtype=torch.float64),
        logits.double().flatten(),
        rtol=0,
        atol=1e-6,
    )
    assert sorted(os.listdir(alone)) == ["model.ckpt"], "loading wrote nothing"


def test_a_truncated_checkpoint_is_a_checkpoint_error_naming_the_file(trained_run, tmp_path):
    data = (trained_run / "checkpoints" / "last.ckpt").read_bytes()
    bad = tmp_path / "truncated.ckpt"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated.ckpt"):
        ConvSeqModule.load_from_checkpoint(str(bad))
    with pytest.raises(CheckpointError, match="truncated.ckpt"):
        load_checkpoint(bad)
    with pytest.raises(CheckpointError, match="missing.ckpt"):
        ConvSeqModule.load_from_checkpoint(str(tmp_path / "missing.ckpt"))


def test_hyperparameters_are_plain_values(trained_run):
    raw = torch.load(trained_run / "checkpoints" / "last.ckpt", weights_only=True)

    def plain(x):
        if isinstance(x, dict):
            return all(isinstance(k, str) and plain(v) for k, v in x.items())
        if isinstance(x, list):
            return all(plain(v) for v in x)
        return x is None or isinstance(x, (str, int, float, bool))

    hp = raw["hyper_parameters"]
    assert set(hp) == {"model", "src_vocab", "tgt_vocab", "optim", "criterion"}
    assert plain(hp) and type(hp["src_vocab"]) is list
