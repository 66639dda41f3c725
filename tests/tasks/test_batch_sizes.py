"""Batch sizes have one key each (`batching.max_tokens`, `batching.max_sentences`) and a corpus's or
a recipe's sizes are a choice of `batch_sizes`, which experiments derived from another inherit
with the rest of its defaults (conf/batch_sizes/default.yaml)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from hydra.errors import ConfigCompositionException

from convseq.common.config import plain as to_plain
from tests.conftest import CONF_DIR, ROOT, compose_config

# experiment (None: the default toy run) -> batching -> (max_tokens, max_sentences, match_max_tokens)
TOY = {"tokens": (1000, None, None), "sentences": (None, 64, None)}
RECIPE = {"tokens": (4000, None, None), "sentences": (None, 64, None)}
COMPARE = {"tokens": (4000, None, None), "sentences": (None, 217, None)}
EXPECTED = {
    None: TOY,
    "multi30k_fconv": RECIPE,
    "multi30k_tune": RECIPE,  # derived from multi30k_fconv
    "multi30k_compare": COMPARE,
    "multi30k_study": COMPARE,  # derived from multi30k_compare
    "multi30k_fast": COMPARE,  # derived from multi30k_compare: 217 (it got 64 by name lookup)
}
CASES = [(e, b) for e in EXPECTED for b in (None, "tokens", "sentences")]


def sizes(overrides: list[str], tmp_path) -> tuple:
    batching = to_plain(compose_config(overrides, output_dir=str(tmp_path)))["batching"]
    return batching["name"], (
        batching["max_tokens"],
        batching["max_sentences"],
        batching["match_max_tokens"],
    )


@pytest.mark.parametrize(("experiment", "batching"), CASES, ids=[f"{e}-{b}" for e, b in CASES])
def test_each_recipe_and_batching_gets_its_batch_sizes(experiment, batching, tmp_path):
    overrides = [f"experiment={experiment}"] if experiment else []
    overrides += [f"batching={batching}"] if batching else []
    name, got = sizes(overrides, tmp_path)
    assert name == (batching or "tokens")
    assert got == EXPECTED[experiment][name]


def _parent(experiment: str) -> str | None:
    """The experiment an experiment's defaults list starts from, if any."""
    text = (CONF_DIR / "experiment" / f"{experiment}.yaml").read_text()
    for entry in yaml.safe_load(text).get("defaults", []):
        if isinstance(entry, str) and (CONF_DIR / "experiment" / f"{entry}.yaml").is_file():
            return entry
    return None


DERIVED = sorted(
    (p.stem, _parent(p.stem)) for p in (CONF_DIR / "experiment").glob("*.yaml") if _parent(p.stem)
)


@pytest.mark.parametrize(("child", "parent"), DERIVED, ids=[c for c, _ in DERIVED])
def test_a_derived_experiment_inherits_its_parents_batch_sizes(child, parent, tmp_path):
    for batching in ("tokens", "sentences"):
        mine = sizes([f"experiment={child}", f"batching={batching}"], tmp_path)
        theirs = sizes([f"experiment={parent}", f"batching={batching}"], tmp_path)
        assert mine == theirs, f"experiment={child} batching={batching}"


def test_derived_experiments_are_found():
    assert ("multi30k_fast", "multi30k_compare") in DERIVED
    assert ("multi30k_study", "multi30k_compare") in DERIVED


def test_a_corpus_picks_its_sizes_and_the_command_line_wins(tmp_path):
    assert sizes(["data=multi30k"], tmp_path)[1] == (4000, None, None)  # not the toy's 1000
    assert sizes(["data=multi30k", "batch_sizes=toy"], tmp_path)[1] == (1000, None, None)
    assert sizes(["batch_sizes=default"], tmp_path)[1] == (4000, None, None)
    assert sizes(["batching.max_tokens=2500"], tmp_path)[1] == (2500, None, None)
    fast = ["experiment=multi30k_fast", "batching=sentences", "batching.max_sentences=100"]
    assert sizes(fast, tmp_path)[1] == (None, 100, None)


def test_the_token_budget_has_one_key(tmp_path):
    cfg = to_plain(compose_config([], output_dir=str(tmp_path)))
    assert "batch_tokens" not in cfg["data"]
    with pytest.raises(ConfigCompositionException):
        compose_config(["data.batch_tokens=2000"], output_dir=str(tmp_path))
    # the command line names the key that holds the budget now
    run = subprocess.run(
        [sys.executable, "run.py", "data.batch_tokens=2000", "--cfg", "job"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert "data.batch_tokens (did you mean batching.max_tokens?)" in run.stderr
