"""`task=preprocess`: build (or reuse) the data-bin of the composed `data` config.

    CONVSEQ_DATA_ROOT=../shared/data python run.py task=preprocess data=multi30k

The work is `convseq.data.preprocess.prepare_databin`: segmentation, dictionaries and binarised
splits in the shared cache, keyed by their inputs (a second call reuses them).
"""

from __future__ import annotations

from pathlib import Path

from convseq.data.preprocess import prepare_databin
from convseq.tasks.config import PreprocessTaskConfig

__all__ = ["run_preprocess"]


def run_preprocess(cfg: PreprocessTaskConfig) -> Path:
    """Build (or reuse) the data-bin of `cfg.data` in the shared cache; return its folder."""
    path = prepare_databin(cfg.data, cfg.paths.cache_dir)
    print(f"data-bin ready: {path}")
    return path
