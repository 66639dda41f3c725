"""The config is typed from the command line to the layer that uses it.

- each group's schema is a dataclass of the layer that owns it, and the task receives them;
- following `cfg` from a training run to the optimiser, the model and the data meets the same
  objects the command line composed (no conversion on the way);
- library code reads attributes: no `.get(...)` or `["key"]` on a config in src/.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import convseq.cli.dispatch as dispatch_module
from convseq.common.config import PathsConfig, TrainerConfig, plain, typed
from convseq.data.config import BatchingConfig, DataConfig
from convseq.errors import SettingError
from convseq.inference.options import GenConfig
from convseq.models.config import FConvConfig
from convseq.optim.config import AnnealConfig, OptimConfig
from convseq.tasks.config import Config, as_config
from convseq.training.config import AmpConfig, CheckpointConfig, CriterionConfig, TrainConfig
from tests.conftest import compose_config

SRC = Path(__file__).resolve().parents[1] / "src" / "convseq"

# group -> (its schema, the module that owns it)
OWNERS = {
    "paths": (PathsConfig, "convseq.common.config"),
    "trainer": (TrainerConfig, "convseq.common.config"),
    "data": (DataConfig, "convseq.data.config"),
    "batching": (BatchingConfig, "convseq.data.config"),
    "model": (FConvConfig, "convseq.models.config"),
    "optim": (OptimConfig, "convseq.optim.config"),
    "anneal": (AnnealConfig, "convseq.optim.config"),
    "criterion": (CriterionConfig, "convseq.training.config"),
    "amp": (AmpConfig, "convseq.training.config"),
    "checkpoint": (CheckpointConfig, "convseq.training.config"),
    "gen": (GenConfig, "convseq.inference.options"),
}


def test_each_group_is_typed_by_the_schema_of_its_own_layer():
    cfg = as_config(compose_config(["optim=adam", "anneal=inverse_sqrt"], output_dir="x"))
    assert isinstance(cfg, Config) and isinstance(cfg, TrainConfig)
    for group, (schema, module) in OWNERS.items():
        assert type(getattr(cfg, group)) is schema, group
        assert schema.__module__ == module, group
    # conf/optim/adam.yaml starts from Adam's own defaults, typed as every optimiser is
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.clip_norm) == ("adam", 0.001, 0.0)


def test_no_schema_repeats_another_ones_fields():
    """One default per key: no two config dataclasses of src/ share three or more fields."""
    schemas = {s for s, _ in OWNERS.values()} | {Config, TrainConfig}
    schemas |= {
        type(getattr(Config(), f.name))
        for f in dataclasses.fields(Config)
        if dataclasses.is_dataclass(getattr(Config(), f.name))
    }
    own = {s: {f.name for f in dataclasses.fields(s)} for s in schemas}
    for a in schemas:
        for b in schemas:
            if a is b or issubclass(a, b) or issubclass(b, a):
                continue
            shared = own[a] & own[b]
            assert len(shared) < 3, f"{a.__name__} and {b.__name__} both define {sorted(shared)}"


def test_dispatch_hands_the_task_the_composed_objects(monkeypatch):
    seen = {}
    monkeypatch.setattr(dispatch_module, "task_function", lambda t: lambda c: seen.update(cfg=c))
    monkeypatch.setattr(dispatch_module, "given_overrides", lambda: None)
    dispatch_module.dispatch(compose_config(["optim.lr=0.5", "gen.beam=3"], output_dir="x"))
    cfg = seen["cfg"]
    assert isinstance(cfg, Config)
    assert isinstance(cfg.optim, OptimConfig) and cfg.optim.lr == 0.5
    assert isinstance(cfg.gen, GenConfig) and cfg.gen.search_kwargs()["beam"] == 3


def test_a_training_run_passes_the_same_objects_down(tiny_data, tmp_path, monkeypatch, one_thread):
    """The optimiser, the model and the data-bin get the very objects of the run's config."""
    import convseq.models.fconv as fconv_module
    import convseq.tasks.train as train_module
    import convseq.training.module as module_module
    from tests.training_utils import tiny_config

    cfg = tiny_config(
        tiny_data, tmp_path / "run", "trainer.max_epochs=1", "trainer.limit_train_batches=2"
    )
    cfg = dataclasses.replace(cfg, final_test=False)
    got = {}

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            got[name] = args
            return fn(*args, **kwargs)

        return wrapped

    build = fconv_module.FConvModel.build.__func__

    def build_spy(cls, model_cfg, *args, **kwargs):
        got["model"] = model_cfg
        return build(cls, model_cfg, *args, **kwargs)

    monkeypatch.setattr(fconv_module.FConvModel, "build", classmethod(build_spy))
    monkeypatch.setattr(
        module_module, "build_optimizer", spy("optim", module_module.build_optimizer)
    )
    monkeypatch.setattr(train_module, "open_databin", spy("data", train_module.open_databin))
    train_module.train(cfg)
    assert got["model"] is cfg.model
    assert got["optim"][1] is cfg.optim
    assert got["data"][0] is cfg.data


def test_typed_names_the_key_of_a_bad_mapping():
    assert typed(OptimConfig, {"lr": 2}).lr == 2.0
    one = OptimConfig(lr=0.5)
    assert typed(OptimConfig, one) is one  # an instance as it is: no copy, no conversion
    with pytest.raises(SettingError, match=r"optim\.lrr: .*the keys of optim are \[.*'lr'"):
        typed(OptimConfig, {"lrr": 2}, "optim")
    with pytest.raises(SettingError, match=r"optim\.lr: .*abc"):
        typed(OptimConfig, {"lr": "abc"}, "optim")
    assert plain(one)["lr"] == 0.5 and plain(Config())["gen"]["beam"] == 5


# -------------------------------------------------------------------------- the library reads attributes

# names the library gives a config (or a group of one) when it holds it
CONFIG_NAMES = {
    "cfg",
    "config",
    "gen",
    "tcfg",
    "trainer_cfg",
    "ck",
    "opts",
    "avg",
    "data",
    "data_cfg",
    "batching",
    "optim",
    "optim_cfg",
    "anneal",
    "anneal_cfg",
    "criterion",
    "amp",
    "report",
    "compare",
    "paths",
}


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def config_lookups(source: str) -> list[tuple[int, str]]:
    """`.get(...)` calls and `["key"]` reads on an expression rooted at a config's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get" and _root(node.func.value) in CONFIG_NAMES:
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            if isinstance(node.slice.value, str) and _root(node.value) in CONFIG_NAMES:
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_check_finds_dict_style_config_reads():
    code = 'a = cfg.get("seed", 1)\nb = cfg["trainer"]["devices"]\nc = cfg.trainer.devices\n'
    assert [line for line, _ in config_lookups(code)] == [1, 2, 2]


def test_library_code_reads_config_attributes():
    offenders = [
        f"{path.relative_to(SRC.parent)}:{line}: {text}"
        for path in sorted(SRC.rglob("*.py"))
        for line, text in config_lookups(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, "dict-style reads of a config:\n" + "\n".join(offenders)
