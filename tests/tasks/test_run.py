"""run.py end to end: a subprocess as a user would start it, and the dispatcher in-process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from convseq.cli.dispatch import dispatch
from tests.conftest import ROOT, compose_config


def test_run_py_preprocess_writes_only_to_the_cache(tmp_path):
    cwd, cache, outputs = tmp_path / "cwd", tmp_path / "cache", tmp_path / "outputs"
    cwd.mkdir()
    env = {**os.environ, "CONVSEQ_CACHE": str(cache), "CONVSEQ_OUTPUTS": str(outputs)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "task=preprocess"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "data-bin ready:" in proc.stdout
    databins = list((cache / "databin").glob("toy-*"))
    assert len(databins) == 1 and (databins[0] / "meta.json").is_file()
    assert (cache / "corpora" / "toy-seed1" / "train.src").is_file()
    assert list(cwd.iterdir()) == [], "a run must not write into the working directory"
    assert not outputs.exists(), "preprocessing makes no run folder (nor .hydra/, nor run.log)"


def test_bad_input_is_one_clear_line_and_exit_status_2(tmp_path, cache_dir, capsys, monkeypatch):
    monkeypatch.setenv("CONVSEQ_DATA_ROOT", str(tmp_path / "nowhere"))
    cfg = compose_config(["task=preprocess", "data=multi30k"], output_dir=str(tmp_path))
    with pytest.raises(SystemExit) as e:
        dispatch(cfg)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("convseq: error: ")
    assert str(tmp_path / "nowhere" / "multi30k") in err
