"""Shared test fixtures: composing the real conf/ tree, a temporary cache for data-bins, and
where the real corpora are (``$CONVSEQ_DATA_ROOT``, as the code reads it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from convseq.cli.schema import compose_task
from tests.training_utils import one_thread, tiny_data  # noqa: F401  (training test fixtures)

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "conf"
SHARED_DATA = ROOT.parent / "shared" / "data"  # where the corpora are when nothing says otherwise


def pytest_configure(config: pytest.Config) -> None:
    """The suite's processes keep their compiled bytecode, and under pytest-xdist (`pytest -n
    2`, the README's command) each worker and the processes its tests start run one thread.

    Bytecode: the suite starts about a hundred Python processes (run.py, DDP ranks, scripts)
    besides its workers; with PYTHONDONTWRITEBYTECODE set (some CI images set it), each would
    compile convseq's modules and the tests again, ~0.8 s a training process. The files go to
    the `__pycache__` folders git ignores, as in any Python run without that variable.

    Threads: two workers of two spinning threads each on two cores would make every test
    several times slower.
    """
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
        sys.dont_write_bytecode = False  # this process; the workers and subprocesses inherit
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)


def data_root() -> Path:
    """The folder that holds the real corpora, found as conf/paths/default.yaml finds it.

    ``$CONVSEQ_DATA_ROOT`` when set (a relative path counts from the working folder, as in the
    config); else ../shared/data beside the project, where the tests have always looked (the
    config's own fallback, ./data, holds no corpus in a fresh clone).
    """
    env = os.environ.get("CONVSEQ_DATA_ROOT")
    if env:
        return Path(os.path.expanduser(env)).absolute()
    return SHARED_DATA


def multi30k_dir() -> Path:
    """``<data root>/multi30k``: see `data_root`."""
    return data_root() / "multi30k"


def missing_multi30k(*names: str) -> str | None:
    """Why the Multi30k tests cannot run, naming where they looked; None when the corpus is there.

    Args:
        names: files the test reads, relative to multi30k/ (default: train.de).
    """
    corpus = multi30k_dir()
    missing = [n for n in names or ("train.de",) if not (corpus / n).is_file()]
    if not missing:
        return None
    if os.environ.get("CONVSEQ_DATA_ROOT"):
        source = "from $CONVSEQ_DATA_ROOT"
    else:
        source = "CONVSEQ_DATA_ROOT is unset: ../shared/data beside the project"
    return (
        f"Multi30k not found: no {', '.join(missing)} in {corpus} ({source}); "
        "set CONVSEQ_DATA_ROOT to the folder that holds multi30k/"
    )


def compose_config(
    overrides: list[str] | None = None,
    output_dir: str | None = None,
    conf_dir: str | Path = CONF_DIR,
):
    """Compose the primary config of the task the overrides name (conf/<task>.yaml, train's
    without task=), as run.py would (Hydra's own checks apply); `conf_dir`: another conf/ tree,
    e.g. a copy with a conf/local/default.yaml of the test's."""
    return compose_task(conf_dir, list(overrides or []), output_dir)


# what an experiment tracker's logger writes into a run folder: TensorBoard's event files and the
# hparams.yaml beside them (Lightning adds that logger only where tensorboard is installed)
TRACKER_FILES = ("events.out.tfevents.", "hparams.yaml")


def _tracker_folder(path: Path) -> bool:
    """Whether `path` is a folder that only an experiment tracker wrote (non-empty, its files all
    TensorBoard's)."""
    if not path.is_dir():
        return False
    files = [q for q in path.rglob("*") if q.is_file()]
    return bool(files) and all(q.name.startswith(TRACKER_FILES) for q in files)


def run_folder_names(folder: Path) -> list[str]:
    """The sorted names in a run folder, leaving out an experiment tracker's folder.

    Which optional packages are installed must not decide a test: with tensorboard installed,
    Lightning's TensorBoard logger adds a folder of event files beside convseq's own files.
    """
    return sorted(p.name for p in folder.iterdir() if not _tracker_folder(p))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """A fresh cache folder, also exported as $CONVSEQ_CACHE for configs and subprocesses."""
    path = tmp_path / "cache"
    path.mkdir()
    monkeypatch.setenv("CONVSEQ_CACHE", str(path))
    return path


@pytest.fixture
def shared_data() -> Path:
    """The data root holding multi30k/ (`data_root`); tests that need it skip cleanly, naming
    where they looked, when it is absent."""
    reason = missing_multi30k()
    if reason is not None:
        pytest.skip(reason)
    return data_root()
