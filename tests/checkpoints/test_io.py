"""Finding a run's checkpoint files: one lookup for resume=, ckpt= (load_any) and task=average."""

from __future__ import annotations

from pathlib import Path

import pytest

from convseq.checkpoints.io import (
    BEST,
    CHECKPOINT_DIR,
    LAST,
    checkpoints_folder,
    find_checkpoint,
    resolve_resume,
)
from convseq.errors import CheckpointError


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_a_run_folder_means_its_checkpoints_folder(tmp_path):
    run = tmp_path / "run"
    assert checkpoints_folder(run) == run  # nothing there yet: the path as it is
    last = touch(run / CHECKPOINT_DIR / LAST)
    assert checkpoints_folder(run) == run / CHECKPOINT_DIR
    assert checkpoints_folder(run / CHECKPOINT_DIR) == run / CHECKPOINT_DIR
    assert find_checkpoint(run, [BEST, LAST]) == last  # no best.ckpt yet
    best = touch(run / CHECKPOINT_DIR / BEST)
    assert find_checkpoint(run, [BEST, LAST]) == best
    assert find_checkpoint(run / CHECKPOINT_DIR, [LAST]) == last
    assert find_checkpoint(tmp_path / "elsewhere", [BEST, LAST]) is None


def test_resume_takes_a_file_a_run_folder_or_a_checkpoints_folder(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(CheckpointError, match="resume=PATH needs"):
        resolve_resume(str(run), tmp_path)
    last = touch(run / CHECKPOINT_DIR / LAST)
    assert resolve_resume(str(run), tmp_path) == last
    assert resolve_resume(str(run / CHECKPOINT_DIR), tmp_path) == last
    assert resolve_resume(str(last), tmp_path) == last
    assert resolve_resume(True, run) == last
    assert resolve_resume(False, run) is None
