"""How torch's idle OpenMP threads wait (convseq.common.omp_wait): chosen as convseq is
imported, before torch loads libgomp; a setting of the user's, or torch imported first, wins."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from convseq.common.omp_wait import MARK, SPIN_COUNT, choose_wait


def test_nothing_set_gets_the_short_spin_and_a_started_process_says_it_is_convseqs():
    env: dict[str, str] = {"PATH": "/bin"}
    choice = choose_wait(env, torch_loaded=False)
    assert env["GOMP_SPINCOUNT"] == str(SPIN_COUNT) and SPIN_COUNT < 300_000
    assert choice.setting == f"GOMP_SPINCOUNT={SPIN_COUNT}"
    assert "convseq's default" in choice.text() and "GOMP_SPINCOUNT=300000" in choice.text()
    # a DDP rank or sweep job started by that process inherits the environment
    child = dict(env)
    again = choose_wait(child, torch_loaded=False)
    assert again == choice and child == env


@pytest.mark.parametrize(
    "mine",
    [
        {"OMP_WAIT_POLICY": "PASSIVE"},
        {"GOMP_SPINCOUNT": "300000"},
        {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "5"},
    ],
)
def test_a_setting_of_the_users_stays_and_is_named(mine):
    env = dict(mine)
    choice = choose_wait(env, torch_loaded=False)
    assert env == mine  # nothing added, nothing changed
    assert choice.setting == " ".join(f"{k}={v}" for k, v in mine.items())
    assert "yours" in choice.source


def test_a_user_setting_that_differs_from_an_inherited_mark_is_the_users():
    env = {"GOMP_SPINCOUNT": "300000", MARK: f"GOMP_SPINCOUNT={SPIN_COUNT}"}
    assert "yours" in choose_wait(env, torch_loaded=False).source


def test_torch_imported_first_is_left_alone_and_said():
    env: dict[str, str] = {}
    choice = choose_wait(env, torch_loaded=True)
    assert env == {}
    assert "libgomp's default" in choice.setting and "import convseq first" in choice.source


def _child(code: str, **extra: str) -> str:
    env = {
        k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", MARK)
    }
    env.update(extra)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_import_convseq_sets_it_for_the_process_and_its_children_before_torch():
    code = (
        "import os, sys, subprocess, convseq; "
        "print('torch' in sys.modules, os.environ.get('GOMP_SPINCOUNT')); "
        "print(subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get(\"GOMP_SPINCOUNT\"))'],"
        " capture_output=True, text=True).stdout.strip())"
    )
    assert _child(code).splitlines() == [f"False {SPIN_COUNT}", str(SPIN_COUNT)]
    assert _child(code, OMP_WAIT_POLICY="PASSIVE").splitlines() == ["False None", "None"]
