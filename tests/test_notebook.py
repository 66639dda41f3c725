"""examples/translate.ipynb runs from top to bottom on a checkpoint made by training, an fconv
one and a LightConv one; the notebook's calls (the public `convseq` API) on a LightConv
checkpoint.

Needs the `notebook` extra (nbclient, nbformat, ipykernel); skipped without it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from convseq.training.module import ConvSeqModule
from tests.generation_utils import tiny_checkpoint
from tests.training.test_lightconv_training import lightconv_run_config
from tests.training_utils import train_one_thread

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "translate.ipynb"


def test_the_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def tiny_lightconv_checkpoint(tiny: dict[str, Path], base: Path) -> Path:
    """best.ckpt of a 1-epoch tiny LightConv (DynamicConv) run, trained once under ``base``."""
    run = base / "tiny_lightconv_run"
    ckpt = run / "checkpoints" / "best.ckpt"
    if not ckpt.is_file():
        overrides = ("trainer.max_epochs=1", "gen.test_bleu=false", "final_test=false")
        train_one_thread(lightconv_run_config(tiny, run, *overrides))
    return ckpt


def test_the_example_notebook_runs_and_shows_translations_and_attention(
    tiny_data, tmp_path_factory, tmp_path, monkeypatch
):
    ckpt = tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())
    run_the_notebook(ckpt, tmp_path, monkeypatch)


# slow: a second kernel start and run; the notebook's machinery is the test above's (fconv), its
# calls on a LightConv checkpoint are test_the_notebooks_calls_on_a_lightconv_checkpoint's
@pytest.mark.slow
def test_the_example_notebook_runs_on_a_lightconv_checkpoint(
    tiny_data, tmp_path_factory, tmp_path, monkeypatch
):
    ckpt = tiny_lightconv_checkpoint(tiny_data, tmp_path_factory.getbasetemp())
    run_the_notebook(ckpt, tmp_path, monkeypatch)


def run_the_notebook(ckpt: Path, tmp_path: Path, monkeypatch) -> None:
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


def test_the_notebooks_calls_on_a_lightconv_checkpoint(tiny_data, tmp_path_factory):
    """What the notebook does, in-process, on a LightConv checkpoint: the module and a
    Translator give the same translations, the n-best list is sorted, the attention has a row
    per source piece and a column per output piece, and an ensemble of the checkpoint with
    itself translates as the checkpoint does."""
    from convseq import ConvSeqModule as PublicModule
    from convseq import Translator

    ckpt = tiny_lightconv_checkpoint(tiny_data, tmp_path_factory.getbasetemp())
    sentences = ["he painted this chair", "three cold kind neighbors held a cold judge"]
    fast = dict(beam=5, max_len_b=10)  # an untrained model rarely ends early
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        module = PublicModule.load_from_checkpoint(str(ckpt), map_location="cpu")
        assert module.model_cfg.family == "lightconv"
        translations = module.translate(sentences, **fast)
        translator = Translator.from_checkpoints(str(ckpt))
        assert translator.translate(sentences, **fast) == translations
        assert all(isinstance(t, str) and t for t in translations)
        record = translator.translate_records(sentences[1:], nbest=3, **fast)[0]
        scores = [h["score"] for h in record["hypotheses"]]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True)
        best = record["hypotheses"][0]
        assert tuple(best["attention"].shape) == (len(record["src_symbols"]), len(best["symbols"]))
        pair = Translator.from_checkpoints([str(ckpt), str(ckpt)])
        assert pair.translate(sentences, **fast) == translations
    finally:
        torch.set_num_threads(threads)
