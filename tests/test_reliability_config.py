"""A bad group option on the command line reaches the user as Hydra says it, through run.py.

Composition-level checks of unknown keys, wrong types and unknown group options are in
test_configs.py (the same Hydra errors); here the message is read from run.py's stderr, as a
user sees it.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import CONF_DIR, ROOT


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "CONVSEQ_CACHE": str(tmp_path / "cache"),
        "CONVSEQ_OUTPUTS": str(tmp_path / "outputs"),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_unknown_group_option_fails_in_run_py_listing_the_valid_choices(tmp_path):
    proc = _run(tmp_path, "optim=adamw")
    assert proc.returncode != 0
    assert "Could not find 'optim/adamw'" in proc.stderr, proc.stderr[-2000:]
    listed = proc.stderr.split("Available options in 'optim':", 1)[1].split()
    valid = sorted(p.stem for p in (CONF_DIR / "optim").glob("*.yaml"))
    assert len(valid) >= 3 and listed[: len(valid)] == valid  # every valid choice
    assert "Traceback" not in proc.stderr  # Hydra's message, not a stack trace
    assert not (tmp_path / "cache").exists()  # nothing ran
    assert list((tmp_path / "cwd").iterdir()) == []
