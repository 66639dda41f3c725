"""Which folder a data config reads: a `data.dir` the user names is read and never written, and
the toy generator writes only into its own folder in the cache (convseq.data.corpus_dir)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from convseq.data.corpus_dir import generated_dir
from convseq.data.databin import DataBin
from convseq.data.preprocess import prepare_databin
from convseq.errors import DataError
from tests.conftest import ROOT, compose_config

SIZES = {"train": 60, "valid": 8, "test": 7}
WORDS = {
    "de": "der die das hund katze haus läuft schläft sieht rot groß klein".split(),
    "en": "the a dog cat house runs sleeps sees red big small old".split(),
}


def write_de_en(folder: Path) -> None:
    """A small German -> English corpus: `{train,valid,test}.{de,en}`, one sentence a line."""
    folder.mkdir(parents=True)
    for split, n in SIZES.items():
        for lang, words in WORDS.items():
            lines = [" ".join(words[(i * k) % len(words)] for k in (1, 3, 5, 7)) for i in range(n)]
            (folder / f"{split}.{lang}").write_text("".join(f"{line}\n" for line in lines))


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (relative path) -> the sha256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_named_data_dir_is_read_as_it_is_and_never_written(tmp_path, cache_dir):
    corpus = tmp_path / "my corpus"
    write_de_en(corpus)
    before = snapshot(corpus)
    # the toy group's other settings (generator: toy among them), the user's folder and pair
    overrides = [f"data.dir={corpus}", "data.src_lang=de", "data.tgt_lang=en"]
    cfg = compose_config(overrides, output_dir=str(tmp_path / "run"))
    assert cfg.data.generator == "toy"
    run = subprocess.run(
        [sys.executable, "run.py", "task=preprocess", *overrides],
        cwd=ROOT,
        env={**os.environ, "CONVSEQ_CACHE": str(cache_dir)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert snapshot(corpus) == before  # the same files, the same bytes: nothing written there
    assert not (cache_dir / "corpora").exists()  # and the generator did not run elsewhere
    databin = DataBin(prepare_databin(cfg.data, cfg.paths.cache_dir, progress=False))
    assert (databin.src_lang, databin.tgt_lang) == ("de", "en")
    assert {s: databin.meta["splits"][s]["sentences"] for s in SIZES} == SIZES
    assert snapshot(corpus) == before


def test_the_default_toy_run_generates_its_corpus_in_the_cache(tmp_path, cache_dir):
    cfg = compose_config([], output_dir=str(tmp_path / "run"))
    assert cfg.data.dir is None and cfg.data.generator == "toy"
    databin = DataBin(prepare_databin(cfg.data, cfg.paths.cache_dir, progress=False))
    folder = cache_dir / "corpora" / "toy-seed1"
    assert folder == generated_dir(cache_dir, "toy", 1)
    assert {"train.src", "train.tgt", "valid.src", "test.tgt"} <= set(snapshot(folder))
    assert databin.meta["splits"]["train"]["sentences"] == 20000
    assert generated_dir(cache_dir, "toy", 2) == cache_dir / "corpora" / "toy-seed2"


def test_data_dir_unset_without_a_generator_is_refused(tmp_path, cache_dir):
    cfg = compose_config(["data.generator=null"], output_dir=str(tmp_path / "run"))
    with pytest.raises(DataError, match="data.dir is unset"):
        prepare_databin(cfg.data, cfg.paths.cache_dir, progress=False)
    assert not (cache_dir / "corpora").exists()
