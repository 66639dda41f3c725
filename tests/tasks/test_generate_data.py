"""task=generate / task=interactive take their data from the checkpoint unless data is given,
and refuse data the checkpoint was not trained on, naming both; no Lightning "predict returned
None" warning on a generate run."""

from __future__ import annotations

import dataclasses
import io
import re
import warnings
from pathlib import Path

import pytest
import torch

import convseq.tasks.generate as generate_mod
from convseq.checkpoints.data_record import DATA_HPARAMS
from convseq.checkpoints.io import TEXT_KEY
from convseq.data.toy.corpus import write_toy_corpus
from convseq.inference.errors import DataMismatchError
from convseq.tasks.config import GenerateTaskConfig
from convseq.tasks.generate import run_generate
from convseq.tasks.interactive import run_interactive
from tests.generation_utils import generate_config, tiny_checkpoint


@pytest.fixture
def tiny_ckpt(tiny_data, tmp_path_factory):
    return tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())


@pytest.fixture
def no_databin(monkeypatch):
    """Any attempt to build or read a data-bin fails: the refusal must come before one."""

    def refuse(*args, **kwargs):
        raise AssertionError("a data-bin was prepared")

    monkeypatch.setattr(generate_mod, "open_databin", refuse)


def not_given(cfg: GenerateTaskConfig) -> GenerateTaskConfig:
    """The config run.py hands the task when the command line names no data."""
    return dataclasses.replace(cfg, data={})


def edited_checkpoint(src: Path, dst: Path, edit) -> Path:
    """A copy of checkpoint ``src`` with ``edit(ckpt)`` applied to its loaded dict."""
    ckpt = torch.load(src, weights_only=True)
    edit(ckpt)
    torch.save(ckpt, dst)
    return dst


# ---------------------------------------------------------------------------- data not given


def test_without_data_the_checkpoints_own_test_set_is_translated(
    tiny_data, tiny_ckpt, tmp_path, one_thread
):
    given = run_generate(
        generate_config(tiny_data, tmp_path / "given", f"ckpt={tiny_ckpt}", "data=toy")
    )
    own = run_generate(not_given(generate_config(tiny_data, tmp_path / "own", f"ckpt={tiny_ckpt}")))
    # the tiny corpus's 40 test sentences, not the default toy data's 1000
    assert own["sentences"] == given["sentences"] == 40
    assert own["scores"]["bleu"] == given["scores"]["bleu"]
    hyps = (tmp_path / "own" / "generate-test.txt").read_text(encoding="utf-8")
    assert hyps == (tmp_path / "given" / "generate-test.txt").read_text(encoding="utf-8")


def test_a_checkpoint_whose_corpus_folder_is_gone_names_it_and_data_dir(
    tiny_data, tiny_ckpt, tmp_path, no_databin
):
    gone = tmp_path / "elsewhere" / "corpus"

    def move(ckpt):
        ckpt[DATA_HPARAMS]["data"]["dir"] = str(gone)

    moved = edited_checkpoint(tiny_ckpt, tmp_path / "moved.ckpt", move)
    cfg = not_given(generate_config(tiny_data, tmp_path / "out", f"ckpt={moved}"))
    with pytest.raises(DataMismatchError) as e:
        run_generate(cfg)
    assert str(gone) in str(e.value) and "not on this machine" in str(e.value)
    assert "data.dir=FOLDER" in str(e.value)


def test_a_checkpoint_without_a_data_record_asks_for_data_but_translates_a_file(
    tiny_data, tiny_ckpt, tmp_path, no_databin, one_thread
):
    def strip(ckpt):  # as task=import_fairseq writes them: no data, no segmentation
        del ckpt[DATA_HPARAMS], ckpt[TEXT_KEY]

    bare = edited_checkpoint(tiny_ckpt, tmp_path / "imported.ckpt", strip)
    with pytest.raises(DataMismatchError, match=r"records no training data.*data=NAME"):
        run_generate(not_given(generate_config(tiny_data, tmp_path / "a", f"ckpt={bare}")))

    src = tmp_path / "in.txt"
    lines = (tiny_data["corpus"] / "test.src").read_text(encoding="utf-8").splitlines()[:5]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = generate_config(tiny_data, tmp_path / "b", f"ckpt={bare}", f"gen.input={src}")
    assert run_generate(not_given(cfg))["sentences"] == 5


# ---------------------------------------------------------------------------- data given


def test_data_of_another_language_pair_is_refused_by_name_before_any_databin(
    tiny_data, tiny_ckpt, tmp_path, no_databin
):
    swapped = ["data.src_lang=tgt", "data.tgt_lang=src"]
    cfg = generate_config(tiny_data, tmp_path, f"ckpt={tiny_ckpt}", *swapped)
    with pytest.raises(DataMismatchError) as e:
        run_generate(cfg)
    message = str(e.value)
    assert message.startswith("checkpoint src->tgt (toy), data tgt->src (toy):")
    assert "language pair src->tgt vs tgt->src" in message and "leave data out" in message


def test_other_dictionary_settings_are_refused_by_key(tiny_data, tiny_ckpt, tmp_path, no_databin):
    cfg = generate_config(tiny_data, tmp_path, f"ckpt={tiny_ckpt}", "data.vocab.nwords=100")
    with pytest.raises(DataMismatchError, match=r"data\.vocab\.nwords: -1 vs 100"):
        run_generate(cfg)


def test_another_corpus_of_the_same_pair_is_refused_once_its_dictionaries_differ(
    tiny_data, tiny_ckpt, tmp_path
):
    other = tmp_path / "other_corpus"
    write_toy_corpus(other, seed=9, n_train=120, n_valid=10, n_test=10)
    cfg = generate_config(tiny_data, tmp_path / "out", f"ckpt={tiny_ckpt}", f"data.dir={other}")
    cfg = dataclasses.replace(
        cfg, paths=dataclasses.replace(cfg.paths, cache_dir=str(tmp_path / "cache"))
    )
    with pytest.raises(DataMismatchError) as e:
        run_generate(cfg)
    message = str(e.value)
    assert message.startswith("checkpoint src->tgt (toy), data src->tgt (data-bin ")
    assert re.search(r"the source dictionary: \d+ vs \d+ symbols", message)
    assert "gen.input=FILE" in message
    assert not (tmp_path / "out" / "generate-test.txt").exists()


def test_given_data_is_checked_with_gen_input_too(tiny_data, tiny_ckpt, tmp_path, no_databin):
    src = tmp_path / "in.txt"
    src.write_text("a line\n", encoding="utf-8")
    # a data option (data=NAME) is the data the user gives: checked though gen.input reads none
    cfg = generate_config(
        tiny_data, tmp_path, f"ckpt={tiny_ckpt}", f"gen.input={src}", "data=toy", "data.src_lang=de"
    )
    with pytest.raises(DataMismatchError, match=r"checkpoint src->tgt \(toy\), data de->tgt"):
        run_generate(cfg)


# ---------------------------------------------------------------------------- interactive


def test_interactive_needs_no_data_and_refuses_data_of_another_pair(tiny_data, tiny_ckpt, tmp_path):
    line = (tiny_data["corpus"] / "test.src").read_text(encoding="utf-8").splitlines()[0]
    cfg = generate_config(tiny_data, tmp_path, f"ckpt={tiny_ckpt}", "task=interactive")
    out = io.StringIO()
    read, translated = run_interactive(
        not_given(cfg), io.BytesIO(f"{line}\n".encode()), out, io.StringIO()
    )
    assert (read, translated) == (1, 1) and out.getvalue().strip()

    swapped = generate_config(
        tiny_data, tmp_path, f"ckpt={tiny_ckpt}", "task=interactive", "data=toy", "data.tgt_lang=xx"
    )
    with pytest.raises(DataMismatchError, match=r"checkpoint src->tgt \(toy\), data src->xx"):
        run_interactive(swapped, io.BytesIO(b""), io.StringIO(), io.StringIO())


# ---------------------------------------------------------------------------- Lightning's noise


def test_a_generate_run_raises_no_predict_returned_none_warning(
    tiny_data, tiny_ckpt, tmp_path, one_thread
):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_generate(generate_config(tiny_data, tmp_path, f"ckpt={tiny_ckpt}"))
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "returned None" in m], messages


def test_data_dir_alone_points_the_checkpoints_own_data_at_its_corpus_here(
    tiny_data, tiny_ckpt, tmp_path, one_thread
):
    """`task=generate ckpt=... data.dir=FOLDER` (no data=NAME): the checkpoint's data settings,
    read from where the corpus is on this machine; other keys set that way are checked."""

    def move(ckpt):
        ckpt[DATA_HPARAMS]["data"]["dir"] = str(tmp_path / "gone")

    moved = edited_checkpoint(tiny_ckpt, tmp_path / "moved.ckpt", move)
    cfg = not_given(generate_config(tiny_data, tmp_path / "out", f"ckpt={moved}"))
    out = run_generate(dataclasses.replace(cfg, data={"dir": str(tiny_data["corpus"])}))
    assert out["sentences"] == 40
    wrong = dataclasses.replace(cfg, data={"dir": str(tiny_data["corpus"]), "src_lang": "tgt"})
    with pytest.raises(DataMismatchError, match="src->tgt"):
        run_generate(wrong)
