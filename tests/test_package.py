"""The package's public face, and checkpoints written before the layered layout.

`from convseq import ...` gives the names a program needs, from the layer that owns each, without
importing torch for `import convseq` alone. `fixtures/pre_layout/` holds a last.ckpt that convseq
wrote before its modules moved into layers (made by fixtures/make_pre_layout.py at commit d40765b,
on an AMD EPYC), with what that code translated from it. Today's code must load it (weights-only,
every key and hyperparameter mapped), translate the same, and continue it exactly as it continues
the same state laid out as it writes checkpoints today. The file's numbers were computed on another
CPU: the bitwise claims compare two runs made here, never a run here with the stored numbers.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import convseq
from tests.conftest import ROOT
from tests.training_utils import last_checkpoint, summary, tiny_config

PUBLIC = {
    "ConvSeqModule": "convseq.training.module",
    "TranslationDataModule": "convseq.data.datamodule",
    "FConvModel": "convseq.models.fconv",
    "LightConvModel": "convseq.models.lightconv",
    "build_model": "convseq.models.family",
    "Translator": "convseq.inference.translator",
    "beam_search": "convseq.search.beam",
    "load_fairseq": "convseq.checkpoints.fairseq",
    "save_fairseq": "convseq.checkpoints.fairseq",
    "GenConfig": "convseq.inference.options",
    "TrainConfig": "convseq.training.config",
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
        LightConvModel,
        TranslationDataModule,
        Translator,
        beam_search,
        build_model,
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
    # a checkpoint from before the model config named its family is an fconv's
    assert "family" not in expected["config_overrides"]
    assert module.hparams["model"] == {**expected["config_overrides"], "family": "fconv"}
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
    # The stored translations were made on another CPU. Words must agree (the model's margins are
    # far wider than rounding); scores to 1e-5: float32 sums of a few dozen log-probabilities,
    # which two vector units may round apart by about 1e-6.
    assert [r["hypotheses"][0]["text"] for r in records] == expected["beam5"]
    scores = [r["hypotheses"][0]["score"] for r in records]
    assert scores == pytest.approx(expected["beam5_scores"], abs=1e-5)
    assert greedy == expected["greedy"]
    assert module.translate(expected["sources"][:2], beam=5, max_len_b=20) == expected["beam5"][:2]


# What today's checkpoints hold that the pre-layout file lacks (each read with a default on load).
# A key path that changes is a format change: map it in the loader, then list it here.
ADDED_SINCE_PRE_LAYOUT = {
    (
        "callbacks",
        "AnnealingCallback",
        "validations",
    ),  # the rules' count with validations by updates
    ("convseq", "validations"),  # every validation's record, for the sweep report
    ("convseq", "skipped_updates"),  # updates skipped for a non-finite gradient
    ("convseq", "command_seconds"),  # the command's wall time (time to quality), carried on
    ("datamodule_hyper_parameters", "data", "test_sets"),  # extra test sets
    ("datamodule_hyper_parameters", "data", "workers"),  # preprocessing worker processes
    ("datamodule_hyper_parameters", "data", "src_dict"),  # a given fairseq dictionary (or None)
    ("datamodule_hyper_parameters", "data", "tgt_dict"),
    ("datamodule_hyper_parameters", "data", "format"),  # convseq | fairseq (a fairseq data-bin)
    ("datamodule_hyper_parameters", "data", "path"),  # the fairseq data-bin's folder (or None)
    ("datamodule_hyper_parameters", "data", "remove_bpe"),  # its subword joiner (or None)
    ("hyper_parameters", "model", "family"),  # the model family (none: fconv's)
}
# keys of the old file that today's code no longer writes (the old file still resumes)
REMOVED_SINCE_PRE_LAYOUT = {
    ("datamodule_hyper_parameters", "data", "batch_tokens"),  # the budget is batching.max_tokens
}


def _key_paths(tree: Any, prefix: tuple = ()) -> set[tuple]:
    """Every key path of a checkpoint's nested dicts, down to the leaves; the keys of
    ModelCheckpoint's `best_k_models` are file paths of the run that wrote it, so they stop there."""
    if not isinstance(tree, dict) or prefix[-1:] == ("best_k_models",):
        return {prefix}
    return set().union(*(_key_paths(v, (*prefix, k)) for k, v in tree.items())) | {prefix}


def _get(tree: dict, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _put(tree: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def _old_state_in_todays_layout(old: dict, today: dict) -> dict:
    """The pre-layout state as today's code lays a checkpoint out: every value the old file holds,
    less the keys removed since, plus the keys added since, with the values today's code wrote
    for the same run's epoch 1."""
    state = copy.deepcopy(old)
    for path in REMOVED_SINCE_PRE_LAYOUT:
        del _get(state, path[:-1])[path[-1]]
    for path in sorted(ADDED_SINCE_PRE_LAYOUT):
        _put(state, path, copy.deepcopy(_get(today, path)))
    return state


def test_an_old_checkpoint_resumes_as_the_same_state_in_todays_layout(tiny_data, tmp_path):
    """The old file, continued by today's code, ends bit for bit where the same numbers laid out
    as today's code writes them end: both runs made here, on this CPU (the file's weights were
    computed on another, so no run here can reproduce them)."""
    from convseq.tasks.train import train

    old = torch.load(PRE_LAYOUT / "last.ckpt", map_location="cpu", weights_only=True)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(tiny_config(tiny_data, tmp_path / "today", "trainer.max_epochs=1"))
        today = last_checkpoint(tmp_path / "today")
        # every key of the old file is one today's code writes but those removed since, and
        # today's adds only these
        gone = _key_paths(old) - _key_paths(today)
        assert gone == REMOVED_SINCE_PRE_LAYOUT, f"keys today's code no longer writes: {gone}"
        assert _key_paths(today) - _key_paths(old) == ADDED_SINCE_PRE_LAYOUT
        assert today["hyper_parameters"].keys() == old["hyper_parameters"].keys()
        for name in ("old", "relaid"):
            (tmp_path / name / "checkpoints").mkdir(parents=True)
        (tmp_path / "old" / "checkpoints" / "last.ckpt").write_bytes(
            (PRE_LAYOUT / "last.ckpt").read_bytes()
        )
        torch.save(
            _old_state_in_todays_layout(old, today),
            tmp_path / "relaid" / "checkpoints" / "last.ckpt",
        )
        for name in ("old", "relaid"):
            train(tiny_config(tiny_data, tmp_path / name, "trainer.max_epochs=2", "resume=true"))
    finally:
        torch.set_num_threads(before)
    a, b = last_checkpoint(tmp_path / "old"), last_checkpoint(tmp_path / "relaid")
    assert summary(tmp_path / "old")["resumed_from"].endswith("last.ckpt")
    assert a["state_dict"].keys() == b["state_dict"].keys() == old["state_dict"].keys()
    for name in a["state_dict"]:
        assert torch.equal(a["state_dict"][name], b["state_dict"][name]), name
        if not name.endswith(".version"):  # a format marker, not a weight
            # and epoch 2 did train: no weight is still the old file's
            assert not torch.equal(a["state_dict"][name], old["state_dict"][name]), name
    states_a, states_b = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    assert states_a.keys() == states_b.keys() == old["optimizer_states"][0]["state"].keys()
    for i in states_a:
        assert torch.equal(states_a[i]["momentum_buffer"], states_b[i]["momentum_buffer"]), i
    assert a["callbacks"]["AnnealingCallback"] == b["callbacks"]["AnnealingCallback"]
    assert a["global_step"] == b["global_step"] == 2 * old["global_step"]
    history = summary(tmp_path / "old")["history"]
    assert [h["epoch"] for h in history] == [1, 2]
    clock = ("train_epoch/time", "train_epoch/ups", "train_epoch/wps")  # wall-clock figures

    def figures(run: str) -> list[dict]:
        return [
            {k: v for k, v in h.items() if k not in clock}
            for h in summary(tmp_path / run)["history"]
        ]

    assert figures("old") == figures("relaid")
    assert history[0] == old["convseq"]["history"][0]  # epoch 1 is the old file's, as it was
