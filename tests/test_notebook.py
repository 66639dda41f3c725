"""examples/translate.ipynb runs from top to bottom on a checkpoint made by training.

Needs the `notebook` extra (nbclient, nbformat, ipykernel); skipped without it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from convseq.training.module import ConvSeqModule
from tests.generation_utils import tiny_checkpoint

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "translate.ipynb"


def test_the_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_the_example_notebook_runs_and_shows_translations_and_attention(
    tiny_data, tmp_path_factory, tmp_path, monkeypatch
):
    ckpt = tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())
    monkeypatch.setenv("CONVSEQ_CKPT", str(ckpt))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError on any failing cell

    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert f"checkpoint: {ckpt}" in text
    pairs = re.findall(r"^(\S.*)\n  -> (.*)$", text, re.M)
    assert len(pairs) == 3
    module = ConvSeqModule.load_from_checkpoint(str(ckpt))
    sources = [s for s, _ in pairs]
    assert [t for _, t in pairs] == module.translate(sources, beam=5)
    ranks = re.findall(r"^(\d)\. +(-?\d+\.\d{4})  ", text, re.M)
    assert [r for r, _ in ranks] == ["1", "2", "3"]
    scores = [float(s) for _, s in ranks]
    assert scores == sorted(scores, reverse=True)
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 1
    assert list(tmp_path.iterdir()) == []  # the notebook writes nothing
