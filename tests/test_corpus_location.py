"""The tests look for Multi30k where the code does ($CONVSEQ_DATA_ROOT, else ../shared/data
beside the project) and skip naming where they looked; a tracker's folder never decides a test."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import (
    SHARED_DATA,
    compose_config,
    data_root,
    missing_multi30k,
    multi30k_dir,
    run_folder_names,
)


def _corpus(root: Path) -> Path:
    (root / "multi30k").mkdir(parents=True)
    (root / "multi30k" / "train.de").write_text("ein Hund\n", encoding="utf-8")
    return root


def test_the_data_root_follows_convseq_data_root(tmp_path, monkeypatch, request):
    root = _corpus(tmp_path / "elsewhere")
    monkeypatch.setenv("CONVSEQ_DATA_ROOT", str(root))
    assert data_root() == root and multi30k_dir() == root / "multi30k"
    assert missing_multi30k() is None
    assert request.getfixturevalue("shared_data") == root


def test_a_relative_data_root_is_read_as_the_config_reads_it(tmp_path, monkeypatch):
    _corpus(tmp_path / "rel")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONVSEQ_DATA_ROOT", "rel")
    cfg = compose_config(["data=multi30k"], output_dir=str(tmp_path / "out"))
    assert str(data_root()) == cfg.paths.data_root == str(tmp_path / "rel")
    assert str(multi30k_dir()) == cfg.data.dir
    assert missing_multi30k() is None


def test_without_the_variable_the_tests_look_beside_the_project(monkeypatch):
    monkeypatch.delenv("CONVSEQ_DATA_ROOT", raising=False)
    assert data_root() == SHARED_DATA == Path(__file__).resolve().parents[2] / "shared" / "data"


def test_a_missing_corpus_is_skipped_naming_where_the_tests_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVSEQ_DATA_ROOT", str(tmp_path / "empty"))
    reason = missing_multi30k("test.en", "tok/test.en")
    assert reason is not None
    assert str(tmp_path / "empty" / "multi30k") in reason and "CONVSEQ_DATA_ROOT" in reason
    assert "test.en, tok/test.en" in reason


def test_a_trackers_folder_is_left_out_of_a_run_folders_listing(tmp_path):
    for name in ("summary.json", "run.log", "checkpoints/best.ckpt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x", encoding="utf-8")
    assert run_folder_names(tmp_path) == ["checkpoints", "run.log", "summary.json"]
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "hparams.yaml").write_text("{}\n", encoding="utf-8")
    (tmp_path / "tb" / f"events.out.tfevents.1.host.{os.getpid()}.0").write_bytes(b"\0")
    assert run_folder_names(tmp_path) == ["checkpoints", "run.log", "summary.json"]
    # a folder holding anything else is convseq's (or a stray file): it stays in the listing
    (tmp_path / "tb" / "notes.txt").write_text("mine", encoding="utf-8")
    assert run_folder_names(tmp_path) == ["checkpoints", "run.log", "summary.json", "tb"]
