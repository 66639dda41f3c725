"""A configuration mistake on the command line reaches the user as run.py prints it: one line on
stderr, exit status 2, nothing made.

Composition-level checks of unknown keys, wrong types and unknown group options are in
test_configs.py (Hydra's own errors) and tasks/test_config_errors.py (run.py's check before
Hydra, in-process, for every task and for sweeps); here the message is read from run.py's
stderr, as a user sees it.
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


def _nothing_made(tmp_path) -> bool:
    return (
        not (tmp_path / "cache").exists()
        and not (tmp_path / "outputs").exists()
        and not (list((tmp_path / "cwd").iterdir()))
    )


def test_an_unknown_group_option_fails_in_run_py_listing_the_valid_choices(tmp_path):
    proc = _run(tmp_path, "optim=adamw")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1, proc.stderr  # one line
    assert proc.stderr.startswith("convseq: error: unknown option optim=adamw (did you mean ")
    listed = proc.stderr.split("the options of optim are ", 1)[1].strip().split(", ")
    valid = sorted(p.stem for p in (CONF_DIR / "optim").glob("*.yaml"))
    assert len(valid) >= 3 and listed == valid  # every valid choice
    assert _nothing_made(tmp_path)


def test_a_wrong_type_in_a_sweep_fails_in_run_py_naming_key_value_and_type(tmp_path):
    proc = _run(tmp_path, "-m", "optim=nag,sgd", "trainer.max_epochs=1,two")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr == (
        "convseq: error: trainer.max_epochs=two: trainer.max_epochs takes an integer, not the "
        "string 'two'\n"
    )
    assert _nothing_made(tmp_path)  # no multirun folder either
