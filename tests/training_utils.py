"""Shared pieces of the training tests: a tiny corpus, a tiny model, typed configs, read-backs.

tests/conftest.py imports the fixtures (`tiny_data`, `one_thread`), so every test module has them.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from convseq.data.databin import DataBin
from convseq.data.preprocess import prepare_databin
from convseq.data.toy.corpus import write_toy_corpus
from convseq.tasks.config import as_config
from convseq.training.config import TrainConfig

# A model small enough for a whole epoch to take a fraction of a second on one core.
TINY_MODEL = [
    "model.encoder_embed_dim=16",
    "model.decoder_embed_dim=16",
    "model.decoder_out_embed_dim=16",
    "model.encoder_layers=[[16,3]]",
    "model.decoder_layers=[[16,3]]",
]
QUIET = ["trainer.enable_progress_bar=false", "trainer.log_every_n_steps=5"]


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> dict[str, Path]:
    """A 300-pair toy corpus (18 batches of <= 300 tokens an epoch) and its data-bin."""
    root = tmp_path_factory.mktemp("tiny_data")
    corpus, cache = root / "corpus", root / "cache"
    write_toy_corpus(corpus, seed=5, n_train=300, n_valid=40, n_test=40)
    cfg = tiny_config({"corpus": corpus, "cache": cache}, root / "unused")
    databin = prepare_databin(cfg.data, str(cache), progress=False)
    return {"corpus": corpus, "cache": cache, "databin": databin}


@pytest.fixture(autouse=False)
def one_thread():
    """One intra-op thread: the machine's other jobs make two spinning threads much slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def train_one_thread(cfg: TrainConfig, callbacks: list | None = None) -> Any:
    """`train(cfg)` on one intra-op thread (the number before is set again after)."""
    from convseq.tasks.train import train

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(cfg, callbacks=callbacks)
    finally:
        torch.set_num_threads(before)


def tiny_corpus(tiny: dict[str, Path]) -> list[str]:
    """The overrides that read the tiny corpus (not the generated toy one) with its cache."""
    return ["data.generator=null", f"data.dir={tiny['corpus']}", f"paths.cache_dir={tiny['cache']}"]


def tiny_config(tiny: dict[str, Path], output_dir: Path | str, *overrides: str) -> TrainConfig:
    """The composed config of a tiny run over the tiny corpus, typed as the command line hands
    it to a task."""
    from tests.conftest import compose_config  # here: conftest imports this module's fixtures

    base = [
        *tiny_corpus(tiny),
        "batching.max_tokens=300",
        *TINY_MODEL,
        *QUIET,
    ]
    return as_config(compose_config([*base, *overrides], output_dir=str(output_dir)))


def train_one_tiny_epoch(tiny: dict[str, Path], output_dir: Path) -> Path:
    """One epoch of the tiny model on one thread: a run folder with best.ckpt and last.ckpt."""
    from convseq.tasks.train import train  # imported late: training pulls in Lightning

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(tiny_config(tiny, output_dir, "trainer.max_epochs=1"))
    finally:
        torch.set_num_threads(before)
    return output_dir


def tiny_databin(tiny: dict[str, Path]) -> DataBin:
    return DataBin(tiny["databin"])


def summary(output_dir: Path | str) -> dict[str, Any]:
    return json.loads((Path(output_dir) / "summary.json").read_text())


def last_checkpoint(output_dir: Path | str) -> dict[str, Any]:
    return torch.load(Path(output_dir) / "checkpoints" / "last.ckpt", weights_only=True)


# what Lightning's DDP launcher reads: a test's subprocess must start as a fresh launch
DDP_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launch_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment of a (DDP) subprocess: one thread a process, no inherited rank."""
    env = {**(base if base is not None else os.environ), "OMP_NUM_THREADS": "1", **extra}
    for key in DDP_VARIABLES:
        env.pop(key, None)
    return env


def ddp_script_command(
    tiny: dict[str, Path], output_dir: Path, record_dir: Path, *overrides: str
) -> list[str]:
    """The command line of tests/ddp_script.py (2 gloo ranks) on the tiny corpus."""
    script = Path(__file__).resolve().parent / "ddp_script.py"
    return [
        sys.executable,
        str(script),
        str(tiny["corpus"]),
        str(tiny["cache"]),
        str(output_dir),
        str(record_dir),
        *overrides,
    ]
