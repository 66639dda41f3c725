"""Shared test fixtures: composing the real conf/ tree, and a temporary cache for data-bins."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from convseq.tasks.schema import register_configs
from tests.training_utils import one_thread, tiny_data  # noqa: F401  (training test fixtures)

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "conf"
SHARED_DATA = ROOT.parent / "shared" / "data"


def compose_config(overrides: list[str] | None = None, output_dir: str | None = None):
    """Compose conf/config.yaml with overrides, as run.py would (Hydra's own checks apply)."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides or []))
    if output_dir is not None:
        cfg.paths.output_dir = output_dir
    return cfg


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """A fresh cache folder, also exported as $CONVSEQ_CACHE for configs and subprocesses."""
    path = tmp_path / "cache"
    path.mkdir()
    monkeypatch.setenv("CONVSEQ_CACHE", str(path))
    return path


@pytest.fixture
def shared_data() -> Path:
    """../shared/data beside the project; tests that need it skip cleanly when it is absent."""
    if not (SHARED_DATA / "multi30k" / "train.de").is_file():
        pytest.skip(f"shared corpus not found at {SHARED_DATA}")
    return SHARED_DATA
