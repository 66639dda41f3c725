"""`python run.py task=generate trainer.devices=2 trainer.strategy=ddp` on the CPU (2 gloo ranks).

Lightning starts the second rank by re-running the command line, so this runs run.py in a
subprocess. The two ranks share the split (each translates a part) and rank 0 writes exactly the
files of a one-process run: the same hypotheses, n-best lines and scores, in input order.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.generation_utils import FAST_GEN, subprocess_env, tiny_checkpoint
from tests.training_utils import launch_env


@pytest.fixture
def tiny_ckpt(tiny_data, tmp_path_factory):
    return tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())


def generate(tiny_data, ckpt, out, devices: int) -> subprocess.CompletedProcess:
    """run.py task=generate in a subprocess (one thread a process, as every rank here)."""
    env = launch_env(subprocess_env(tiny_data))
    strategy = ["trainer.strategy=ddp"] if devices > 1 else []
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "task=generate",
            f"ckpt={ckpt}",
            "data.generator=null",
            f"data.dir={tiny_data['corpus']}",
            f"paths.cache_dir={tiny_data['cache']}",
            *FAST_GEN,
            "gen.max_tokens=200",
            "trainer.accelerator=cpu",
            f"trainer.devices={devices}",
            *strategy,
            f"hydra.run.dir={out}",
        ],
        cwd=out.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


# slow: the default run covers two generating ranks writing one process's files through the same
# sharding and gathering (tests/tasks/test_generate_input.py)
@pytest.mark.slow
def test_two_ranks_write_exactly_the_files_of_one_process(tiny_data, tiny_ckpt, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    generate(tiny_data, tiny_ckpt, one, 1)
    proc = generate(tiny_data, tiny_ckpt, two, 2)
    for name in ("generate-test.txt", "generate-test.nbest.txt"):
        assert (two / name).read_bytes() == (one / name).read_bytes(), name
    a = json.loads((one / "generate-test.json").read_text())
    b = json.loads((two / "generate-test.json").read_text())
    assert b["scores"] == a["scores"] and b["tokens"] == a["tokens"]
    assert (a["devices"], b["devices"]) == (1, 2)
    assert a["sentences_per_rank"] == [40]
    shares = b["sentences_per_rank"]
    assert len(shares) == 2 and sum(shares) == 40 and min(shares) > 0  # both ranks translated
    assert proc.stdout.count("hypotheses written to") == 1  # rank 0 alone writes and prints
