"""Loading a convseq checkpoint for translation builds the model from the checkpoint alone.

`convseq.inference.loading` sits below training: it never constructs the LightningModule, yet
gives the same weights, and refuses a checkpoint whose weights do not fit the model it describes.
"""

from __future__ import annotations

import pytest
import torch

from convseq.errors import CheckpointError
from convseq.inference.loading import load_any
from convseq.training.module import ConvSeqModule
from tests.generation_utils import tiny_checkpoint


@pytest.fixture
def tiny_ckpt(tiny_data, tmp_path_factory):
    return tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())


def test_the_model_is_built_without_the_lightning_module_with_its_weights(tiny_ckpt, monkeypatch):
    module = ConvSeqModule.load_from_checkpoint(str(tiny_ckpt))
    expected = {k: v.clone() for k, v in module.model.state_dict().items()}

    def refuse(*args, **kwargs):
        raise AssertionError("inference built the LightningModule")

    monkeypatch.setattr(ConvSeqModule, "__init__", refuse)
    loaded = load_any(tiny_ckpt.parent.parent)  # a run folder: its best.ckpt
    assert not loaded.model.training
    assert loaded.src_dict == module.src_dict and loaded.tgt_dict == module.tgt_dict
    assert loaded.text == module.text_processing
    got = loaded.model.state_dict()
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(got[name], value), name


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda sd: sd.update({"criterion.extra": torch.zeros(1)}), "unexpected weights"),
        (lambda sd: sd.pop("model.decoder.fc3.bias"), "fc3.bias"),
        (
            lambda sd: sd.update({"model.decoder.fc3.bias": torch.zeros(3)}),
            "size mismatch",
        ),
    ],
    ids=["extra", "missing", "shape"],
)
def test_weights_that_do_not_fit_the_described_model_are_refused_naming_the_file(
    tiny_ckpt, tmp_path, damage, words
):
    ckpt = torch.load(tiny_ckpt, weights_only=True)
    damage(ckpt["state_dict"])
    path = tmp_path / "damaged.ckpt"
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError, match=words) as info:
        load_any(path)
    assert str(path) in str(info.value)


def test_vocabularies_that_disagree_on_the_pad_symbol_are_refused(tiny_ckpt, tmp_path):
    ckpt = torch.load(tiny_ckpt, weights_only=True)
    vocab = ckpt["hyper_parameters"]["src_vocab"]
    ckpt["hyper_parameters"]["src_vocab"] = ["<pad>", "<s>", *vocab[2:]]  # specials reordered
    path = tmp_path / "bad_vocab.ckpt"
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError, match="bad_vocab.ckpt"):
        load_any(path)
