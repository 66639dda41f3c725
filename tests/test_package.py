"""The package's public face, and checkpoints written before the layered layout.

`from convseq import ...` gives the names a program needs, from the layer that owns each, without
importing torch for `import convseq` alone. `fixtures/pre_layout/` holds a last.ckpt that convseq
wrote before its modules moved into layers (made by fixtures/make_pre_layout.py at commit d40765b),
with what that code translated from it: today's code must load it (weights-only), translate the
same, and resume it to the weights of an uninterrupted run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import convseq
from tests.conftest import ROOT
from tests.training_utils import last_checkpoint, summary, tiny_config

PUBLIC = {
    "ConvSeqModule": "convseq.training.module",
    "TranslationDataModule": "convseq.data.datamodule",
    "FConvModel": "convseq.models.fconv",
    "Translator": "convseq.inference.translator",
    "beam_search": "convseq.search.beam",
    "load_fairseq": "convseq.checkpoints.fairseq",
    "save_fairseq": "convseq.checkpoints.fairseq",
}
PRE_LAYOUT = Path(__file__).resolve().parent / "fixtures" / "pre_layout"


# -- the public face ------------------------------------------------------------------------------
def test_the_public_names_are_exactly_these_and_come_from_their_layers():
    import importlib

    assert set(convseq.__all__) == {*PUBLIC, "__version__"}
    for name, module in PUBLIC.items():
        value = getattr(convseq, name)
        assert value is getattr(importlib.import_module(module), name), name
        assert value.__module__ == module, name
    from convseq import (  # noqa: F401  (the import the docs show must work as written)
        ConvSeqModule,
        FConvModel,
        TranslationDataModule,
        Translator,
        beam_search,
        load_fairseq,
        save_fairseq,
    )

    assert set(PUBLIC) <= set(dir(convseq))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Trainer'"):
        convseq.Trainer  # noqa: B018
    with pytest.raises(ImportError):
        from convseq import train  # noqa: F401


def test_import_convseq_alone_loads_neither_torch_nor_lightning():
    code = (
        "import sys, convseq; "
        "print(sorted(m for m in ('torch', 'pytorch_lightning') if m in sys.modules)); "
        "convseq.Translator; "
        "print(sorted(m for m in ('torch', 'pytorch_lightning') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.splitlines()
    assert out[0] == "[]"
    assert out[1] == "['torch']"  # the Translator needs torch, not the training stack


# -- a checkpoint from before the layout ----------------------------------------------------------
@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads((PRE_LAYOUT / "expected.json").read_text())


def test_an_old_checkpoint_loads_weights_only_as_the_module_and_as_a_translator(expected):
    from convseq import ConvSeqModule, Translator

    path = PRE_LAYOUT / "last.ckpt"
    module = ConvSeqModule.load_from_checkpoint(str(path), map_location="cpu", weights_only=True)
    assert module.hparams["model"] == expected["config_overrides"]
    translator = Translator.from_checkpoints(path)
    # the translator's model is built from the hyperparameters alone: the same weights
    theirs = translator.models[0].state_dict()
    for name, value in module.model.state_dict().items():
        assert torch.equal(value, theirs[name]), name
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        records = translator.translate_records(expected["sources"], beam=5, max_len_b=20)
        greedy = translator.translate(expected["sources"], beam=1, max_len_b=20)
    finally:
        torch.set_num_threads(before)
    assert [r["hypotheses"][0]["text"] for r in records] == expected["beam5"]
    scores = [r["hypotheses"][0]["score"] for r in records]
    assert scores == pytest.approx(expected["beam5_scores"], abs=1e-5)
    assert greedy == expected["greedy"]
    assert module.translate(expected["sources"][:2], beam=5, max_len_b=20) == expected["beam5"][:2]


def test_an_old_checkpoint_resumes_to_the_weights_of_an_uninterrupted_run(tiny_data, tmp_path):
    """Epoch 1 by the old code, epoch 2 by today's == both epochs by today's, bit for bit."""
    from convseq.tasks.train import train

    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    (resumed / "checkpoints" / "last.ckpt").write_bytes((PRE_LAYOUT / "last.ckpt").read_bytes())
    straight = tmp_path / "straight"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(tiny_config(tiny_data, straight, "trainer.max_epochs=2"))
        train(tiny_config(tiny_data, resumed, "trainer.max_epochs=2", "resume=true"))
    finally:
        torch.set_num_threads(before)
    assert summary(resumed)["resumed_from"].endswith("last.ckpt")
    a, b = last_checkpoint(straight)["state_dict"], last_checkpoint(resumed)["state_dict"]
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert [h["epoch"] for h in summary(resumed)["history"]] == [1, 2]
