"""Shared pieces of the generation tests: one tiny trained checkpoint per session, fast settings.

The checkpoint is trained once (3 epochs of the tiny model on the tiny corpus, a few seconds)
into the session's temporary folder and reused by every generation test module.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from convseq.tasks.config import GenerateTaskConfig, as_config
from convseq.tasks.train import train
from tests.training_utils import tiny_config, tiny_corpus

# An untrained-looking tiny model rarely emits EOS early: cap the outputs to keep searches short.
FAST_GEN = ["gen.max_len_b=12", "gen.max_tokens=600"]


def tiny_checkpoint(tiny: dict[str, Path], base: Path) -> Path:
    """best.ckpt of a 3-epoch tiny run, trained once under ``base`` and reused."""
    run = base / "tiny_generation_run"
    ckpt = run / "checkpoints" / "best.ckpt"
    if ckpt.is_file():
        return ckpt
    shutil.rmtree(run, ignore_errors=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = tiny_config(tiny, run, "trainer.max_epochs=3", "gen.test_bleu=false")
        train(cfg)
    finally:
        torch.set_num_threads(threads)
    assert ckpt.is_file()
    return ckpt


def generate_config(tiny: dict[str, Path], out: Path, *overrides: str) -> GenerateTaskConfig:
    """The typed config of ``task=generate`` over the tiny corpus (conf/generate.yaml: the
    checkpoint's data, read from the tiny corpus folder), as the command line hands it."""
    from tests.conftest import compose_config  # here: conftest imports training_utils' fixtures

    base = ["task=generate", *tiny_corpus(tiny), *FAST_GEN]
    return as_config(compose_config([*base, *overrides], output_dir=str(out)))


def subprocess_env(tiny: dict[str, Path]) -> dict[str, str]:
    """Environment of a run.py subprocess: the tiny cache, one thread, the project importable."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    env["CONVSEQ_CACHE"] = str(tiny["cache"])
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), env.get("PYTHONPATH", "")])
    return env
