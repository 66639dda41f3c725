"""Preprocessing with worker processes, sampled sentencepiece training, and bounded memory."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest

import convseq.data.binarize as bz
import convseq.data.preprocess as pp
import convseq.data.spool as spool
import convseq.data.textio as textio
from convseq.data.databin import DataBin
from convseq.data.encode import WORKER_ENV
from convseq.errors import DataError
from tests.data.reference_corpora import why_pins_do_not_apply, write_reference_corpus

FIXTURE = json.loads(
    (Path(__file__).parent / "fixtures" / "databin_sha256.json").read_text(encoding="utf-8")
)


def file_bytes(path: Path) -> dict[str, bytes]:
    """Every file of a data-bin; meta.json without its build date and time."""
    out = {p.name: p.read_bytes() for p in sorted(path.iterdir())}
    meta = json.loads(out.pop("meta.json"))
    for volatile in ("created", "build_seconds"):
        meta.pop(volatile)
    out["meta.json"] = json.dumps(meta, sort_keys=True).encode()
    return out


@pytest.mark.parametrize("name", ["toy-words", "synthetic-bpe-joint"])
def test_one_two_or_three_workers_make_the_same_bytes(tmp_path, monkeypatch, name):
    monkeypatch.setattr(bz, "CHUNK", 97)  # many blocks, so that every worker gets some
    monkeypatch.setattr(spool, "READ_SENTENCES", 250)
    cfg = write_reference_corpus(name, tmp_path / "corpus")
    built = {}
    for workers in (1, 2, 3):
        path = pp.prepare_databin({**cfg, "workers": workers}, str(tmp_path / f"w{workers}"))
        built[workers] = path
    assert built[1].name == built[2].name == built[3].name  # same key
    one = file_bytes(built[1])
    assert file_bytes(built[2]) == one
    assert file_bytes(built[3]) == one
    # and they are the bytes that the code before streaming made
    if why_pins_do_not_apply(name, FIXTURE):
        return  # another sentencepiece release: test_reference_databins says so and skips
    pinned = FIXTURE["databins"][name]["files"]
    assert {n: hashlib.sha256(b).hexdigest() for n, b in one.items() if n != "meta.json"} == pinned


def test_the_key_does_not_depend_on_workers(tmp_path):
    cfg = write_reference_corpus("toy-words-joined", tmp_path / "corpus")
    cache = str(tmp_path / "cache")
    assert pp.databin_path({**cfg, "workers": 1}, cache) == pp.databin_path(
        {**cfg, "workers": 4}, cache
    )
    path, built = pp.ensure_databin({**cfg, "workers": 1}, cache, progress=False)
    assert built
    assert pp.ensure_databin({**cfg, "workers": 3}, cache, progress=False) == (path, False)
    with pytest.raises(DataError, match="data.workers must be >= 1"):
        pp.prepare_databin({**cfg, "workers": 0}, cache)


def test_sample_size_changes_the_key_only_when_it_samples(tmp_path):
    cfg = write_reference_corpus("synthetic-bpe-joint", tmp_path / "corpus")
    cache = str(tmp_path / "cache")

    def key_of(size: int) -> str:
        sub = {**cfg["subword"], "input_sentence_size": size}
        return pp.databin_path({**cfg, "subword": sub}, cache).name

    # 2000 train lines a side, so at most 4000 sentences for the joint model (the key bounds them
    # by 2001 + 2001: a last line may lack its newline): sampling more, like the default, draws
    # everything, which is what 0 means.
    small = {key_of(0), key_of(4002), key_of(1_000_000), pp.databin_path(cfg, cache).name}
    assert small == {key_of(0)} and key_of(0).endswith(
        FIXTURE["databins"]["synthetic-bpe-joint"]["meta"]["key"][:12]
    )
    assert len({key_of(0), key_of(1500), key_of(3000)}) == 3


def test_sampled_sentencepiece_is_reproducible(tmp_path):
    cfg = write_reference_corpus("synthetic-unigram-separate", tmp_path / "corpus")
    cfg["subword"] = {**cfg["subword"], "input_sentence_size": 800}
    a = pp.prepare_databin(cfg, str(tmp_path / "a"), progress=False)
    b = pp.prepare_databin(cfg, str(tmp_path / "b"), progress=False)
    assert file_bytes(a) == file_bytes(b)
    meta = DataBin(a).meta
    assert meta["subword"]["trained_on"] == {"spm.de.model": 800, "spm.en.model": 800}
    assert meta["settings"]["subword"]["input_sentence_size"] == 800
    full = pp.prepare_databin(
        {**cfg, "subword": {**cfg["subword"], "input_sentence_size": 0}},
        str(tmp_path / "c"),
        progress=False,
    )
    # 2000 lines less the 2 empty pairs (the over-long pair is dropped after segmentation)
    assert DataBin(full).meta["subword"]["trained_on"]["spm.de.model"] == 1998
    assert (full / "spm.de.model").read_bytes() != (a / "spm.de.model").read_bytes()


def _repeated_corpus(folder: Path, pairs: int) -> dict:
    """`pairs` train pairs that cycle through 200 distinct ones: only the size grows."""
    base = write_reference_corpus("toy-words", folder / "base")
    src = (folder / "base" / "train.src").read_text().splitlines()[:200]
    tgt = (folder / "base" / "train.tgt").read_text().splitlines()[:200]
    corpus = folder / f"n{pairs}"
    corpus.mkdir()
    for lang, lines in (("src", src), ("tgt", tgt)):
        text = "".join(lines[i % 200] + "\n" for i in range(pairs))
        (corpus / f"train.{lang}").write_text(text)
        for split in ("valid", "test"):
            (corpus / f"{split}.{lang}").write_text("".join(ln + "\n" for ln in lines[:50]))
    return {**base, "dir": str(corpus)}


def test_memory_does_not_grow_with_the_corpus(tmp_path, monkeypatch):
    # Small blocks, so that a block is far smaller than the corpus; then the peak of traced
    # allocations (Python objects and numpy arrays) while the data-bin is built must stay flat
    # from 10k to 40k pairs, but for one flag byte per input line. Before streaming it grew by
    # about 4 KB a pair: every line and token list of the corpus was held at once.
    monkeypatch.setattr(bz, "CHUNK", 500)
    monkeypatch.setattr(spool, "READ_SENTENCES", 500)
    monkeypatch.setattr(textio, "BLOCK_BYTES", 1 << 14)
    build = pp.build_databin

    def traced_build(*args):
        tracemalloc.reset_peak()  # the peak of building only, not of hashing the inputs
        return build(*args)

    monkeypatch.setattr(pp, "build_databin", traced_build)
    peaks = {}
    for pairs in (10_000, 40_000):
        cfg = _repeated_corpus(tmp_path, pairs)
        tracemalloc.start()
        try:
            pp.prepare_databin(cfg, str(tmp_path / "cache"), progress=False)
            peaks[pairs] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peaks[40_000] < peaks[10_000] + 4 * 30_000, peaks


def test_a_worker_never_starts_preprocessing_itself(tmp_path, monkeypatch):
    cfg = write_reference_corpus("toy-words-joined", tmp_path / "corpus")
    monkeypatch.setenv(WORKER_ENV, str(os.getpid()))  # this process builds: no error
    pp.prepare_databin(cfg, str(tmp_path / "cache"), progress=False)
    monkeypatch.setenv(WORKER_ENV, str(os.getppid()))  # as in a worker of the parent's build
    with pytest.raises(DataError, match="if __name__ == '__main__'"):
        pp.prepare_databin(cfg, str(tmp_path / "cache"))


def test_a_script_without_main_guard_fails_instead_of_hanging(tmp_path):
    # Spawned workers import the main script again; unguarded, it would start preprocessing
    # once more and wait forever for the lock that its parent holds.
    cfg = write_reference_corpus("toy-words-joined", tmp_path / "corpus")
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from convseq.data.preprocess import prepare_databin
            prepare_databin({{**{cfg!r}, "workers": 2}}, {str(tmp_path / "cache")!r})
            """
        )
    )
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=root
    )
    assert run.returncode != 0
    assert "if __name__ == '__main__'" in run.stderr
