"""The layers are enforced: `lint-imports` keeps pyproject.toml's contracts on the real package,
and breaks them on a copy of it with an upward import (inside a function) or an import circle.

The copy is renamed (`convseq` -> `layered_copy`) so that it cannot be confused with the
installed package, and checked against the same contracts with the names changed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("importlinter") is None,
    reason="import-linter not installed (pip install -e '.[dev]')",
)
COPY = "layered_copy"


def lint_imports(config: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    lint = Path(sys.executable).with_name("lint-imports")
    command = [str(lint)] if lint.exists() else ["lint-imports"]
    return subprocess.run(
        [*command, "--config", str(config), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=config.parent,
        env=env,
    )


@pytest.fixture(scope="module")
def contracts() -> list[dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["root_package"] == "convseq"
    return config["contracts"]


def test_the_contracts_name_every_folder_of_the_package(contracts):
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    named = {m.strip() for layer in layers for m in layer.split("|")}
    package = ROOT / "src" / "convseq"
    folders = {f"convseq.{p.name}" for p in package.iterdir() if (p / "__init__.py").is_file()}
    assert folders <= named, folders - named
    assert any(c["type"] == "acyclic_siblings" and c["ancestors"] == ["convseq"] for c in contracts)


def test_the_package_keeps_its_contracts():
    result = lint_imports(ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def copy_with_contracts(tmp_path: Path, contracts: list[dict]) -> tuple[Path, Path]:
    """The package copied as `layered_copy` under tmp_path/src, and a config checking it."""
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "src" / "convseq", src / COPY, ignore=shutil.ignore_patterns("__pycache__")
    )
    for path in (src / COPY).rglob("*.py"):
        path.write_text(re.sub(r"\bconvseq\.", f"{COPY}.", path.read_text()))
    # the real config's contract on `studies` (an external package) needs externals in the graph
    lines = ["[tool.importlinter]", f'root_package = "{COPY}"', "include_external_packages = true"]
    for c in contracts:
        lines.append("[[tool.importlinter.contracts]]")
        for key, value in c.items():
            if isinstance(value, list):
                value = [v.replace("convseq", COPY) for v in value]
                lines.append(f"{key} = [{', '.join(repr(v) for v in value)}]")
            else:
                lines.append(f"{key} = {str(value).replace('convseq', COPY)!r}")
        lines.append("")
    config = tmp_path / "pyproject.toml"
    config.write_text("\n".join(lines).replace("'", '"'))
    return src, config


def test_an_unchanged_copy_keeps_the_contracts(tmp_path, contracts):
    src, config = copy_with_contracts(tmp_path, contracts)
    result = lint_imports(config, src)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_model_importing_training_inside_a_function_breaks_the_layers(tmp_path, contracts):
    src, config = copy_with_contracts(tmp_path, contracts)
    fconv = src / COPY / "models" / "fconv.py"
    fconv.write_text(
        fconv.read_text()
        + f"\n\ndef _upward():\n    from {COPY}.training.module import ConvSeqModule\n\n"
        "    return ConvSeqModule\n"
    )
    result = lint_imports(config, src)
    assert result.returncode != 0
    assert "errors BROKEN" in result.stdout  # the layers contract
    assert f"{COPY}.models.fconv -> {COPY}.training.module" in result.stdout


def test_inference_importing_evaluation_breaks_the_independence_of_siblings(tmp_path, contracts):
    src, config = copy_with_contracts(tmp_path, contracts)
    ensemble = src / COPY / "inference" / "ensemble.py"
    ensemble.write_text(ensemble.read_text() + f"\nfrom {COPY}.evaluation import scores  # noqa\n")
    result = lint_imports(config, src)
    assert result.returncode != 0
    assert f"{COPY}.inference.ensemble -> {COPY}.evaluation.scores" in result.stdout


def test_an_import_circle_between_two_modules_of_a_folder_breaks_the_contracts(tmp_path, contracts):
    src, config = copy_with_contracts(tmp_path, contracts)
    metrics = src / COPY / "training" / "metrics.py"  # module.py imports metrics.py
    metrics.write_text(
        metrics.read_text() + f"\n\ndef _circle():\n    from {COPY}.training import module\n\n"
        "    return module\n"
    )
    result = lint_imports(config, src)
    assert result.returncode != 0
    assert "at any depth BROKEN" in result.stdout  # the acyclic-siblings contract
    assert f"No cycles are allowed in {COPY}.training" in result.stdout
