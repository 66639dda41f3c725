"""Before/after comparisons for bench/bench_search.py: the searches of an earlier git revision.

`load_baseline(rev)` reads ``src/convseq/search/beam.py`` and ``reference.py`` as they were at
``rev`` (``git show``) and loads them as separate modules beside the current ones, so that one
process can run both, interleaved. They import the current shared search modules
(``convseq.search.interface``, ``run``, ``timing``, ``buffers``); a revision from before those
names (``convseq.search.common`` and ``convseq.search.history``) gets its own copies of the old
modules instead, loaded the same way.
`CopyingCache` gives them the decoder's reorder as it was before the cached encoder output was
left in place on steps that do not shrink the batch.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from convseq.search import IncrementalDecoderModel

ROOT = Path(__file__).resolve().parents[1]


class CopyingCache(IncrementalDecoderModel):
    """The model with the decoder's reorder as it was before the copy-skip: the cached encoder
    output (keys, values, mask) copied at every step. For the baseline arms only."""

    def reorder_incremental_state(self, incremental_state: dict, new_order: torch.Tensor) -> None:
        decoder = self.model.decoder
        for conv in decoder.convolutions:
            conv.reorder_incremental_state(incremental_state, new_order)
        cached = incremental_state.get(decoder._cache_key)
        if cached is not None:
            incremental_state[decoder._cache_key] = tuple(
                None if t is None else t.index_select(0, new_order) for t in cached
            )


def load_baseline(rev: str) -> dict[str, Callable]:
    """`beam_search` and `reference_beam_search` as they were at git revision `rev`."""

    def show(path: str) -> str | None:
        shown = subprocess.run(
            ["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True
        )
        return shown.stdout if shown.returncode == 0 else None

    # the shared modules as they were named before the search's modules were renamed
    renamed = {}
    for old in ("common", "history"):
        if show(f"src/convseq/search/{old}.py") is not None:
            renamed[f"convseq.search.{old}"] = f"baseline_{rev}_{old}"

    def load(path: str) -> ModuleType:
        source = show(path)
        if source is None:
            raise FileNotFoundError(f"{path} is not in revision {rev}")
        for old, name in renamed.items():
            source = source.replace(f"from {old} import", f"from {name} import")
        name = f"baseline_{rev}_{Path(path).stem}"
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, None))
        sys.modules[name] = module
        exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)  # noqa: S102
        return module

    for old in ("common", "history"):
        if f"convseq.search.{old}" in renamed:
            load(f"src/convseq/search/{old}.py")
    return {
        f"tensorized@{rev}": load("src/convseq/search/beam.py").beam_search,
        f"reference@{rev}": load("src/convseq/search/reference.py").reference_beam_search,
    }
