"""Data that does not fit the run: another vocabulary, a token budget no batch can meet.

The per-line checks of corpora, dictionaries and data-bins are in test_textio, test_preprocess,
test_dictionary and test_batching (see docs/reliability.md); here they are taken through a whole
training run, and the run must fail before it trains, saying what to change, with nothing lost.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import pytest
import pytorch_lightning as pl

from convseq.cli.dispatch import dispatch
from convseq.errors import CheckpointError, DataError
from convseq.tasks.train import train
from tests.training_utils import tiny_config, train_one_tiny_epoch


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory) -> Path:
    """One epoch of the tiny model on the tiny corpus."""
    return train_one_tiny_epoch(tiny_data, tmp_path_factory.mktemp("trained"))


def _state(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _other_corpus(tiny: dict[str, Path], dest: Path, change: str) -> Path:
    """A copy of the tiny corpus whose vocabulary differs: more source words, or one renamed."""
    shutil.copytree(tiny["corpus"], dest)
    if change == "more words":
        with open(dest / "train.src", "a", encoding="utf-8") as f:
            f.write(" ".join(f"neu{i}" for i in range(20)) + "\n")
        with open(dest / "train.tgt", "a", encoding="utf-8") as f:
            f.write("new\n")
    else:  # the same number of target words, one of them spelt differently
        text = (dest / "train.tgt").read_text(encoding="utf-8")
        word = text.split()[0]
        renamed = "\n".join(
            " ".join("zzz" + w if w == word else w for w in line.split())
            for line in text.split("\n")
        )
        (dest / "train.tgt").write_text(renamed, encoding="utf-8")
    return dest


@pytest.mark.parametrize(
    ("change", "side", "how"),
    [
        ("more words", "src_vocab", r"\d+ symbols there, \d+ in "),
        ("a renamed word", "tgt_vocab", r"both \d+ symbols, but symbol \d+ is '\w+' there and "),
    ],
)
def test_resuming_on_a_data_bin_with_another_vocabulary_is_refused(
    trained, tiny_data, one_thread, tmp_path, change, side, how
):
    corpus = _other_corpus(tiny_data, tmp_path / "corpus", change)
    before = _state(trained)
    out = tmp_path / "run"
    cfg = tiny_config(tiny_data, out, f"data.dir={corpus}", f"resume={trained}")
    with pytest.raises(CheckpointError) as e:
        train(cfg)
    msg = str(e.value)
    last = trained / "checkpoints" / "last.ckpt"
    lang = "src" if side == "src_vocab" else "tgt"
    assert msg.startswith(f"{last}: its {side} does not match this run's data-bin (")
    assert f"/dict.{lang}.txt); resume with the data" in msg
    assert re.search(how, msg)
    databin = msg.split(" in ")[-1].split(f"/dict.{lang}.txt")[0]
    assert Path(databin).parent == tiny_data["cache"] / "databin" and Path(databin).is_dir()
    assert Path(databin) != tiny_data["databin"]  # the other corpus's data-bin is named
    assert _state(trained) == before and not list(out.rglob("*.ckpt"))


class CountBatches(pl.Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.batches += 1


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (
            ["batching.max_tokens=5", "batching.max_tokens_valid=1000"],
            "train: batching.max_tokens=5 is smaller than the longest pair",
        ),
        (
            ["batching.max_tokens_valid=5"],
            "valid: batching.max_tokens_valid (or max_tokens)=5 is smaller than the longest pair",
        ),
    ],
)
def test_a_token_budget_below_the_longest_pair_fails_before_training(
    tiny_data, one_thread, tmp_path, capsys, overrides, words
):
    out = tmp_path / "run"
    counter = CountBatches()
    with pytest.raises(DataError, match=re.escape(words)):
        train(tiny_config(tiny_data, out, *overrides, "trainer.max_epochs=2"), [counter])
    assert counter.batches == 0  # not an empty epoch, not an epoch trained for nothing
    assert not list(out.rglob("*.ckpt")) and not list(out.rglob("metrics.csv"))
    # What a user of run.py sees: one line, exit status 2.
    with pytest.raises(SystemExit) as e:
        dispatch(tiny_config(tiny_data, tmp_path / "cli", *overrides, "trainer.max_epochs=2"))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"convseq: error: {words} kept (29 tokens, EOS included)" in err
    assert "raise it to at least 29" in err
