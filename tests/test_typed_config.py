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
from convseq.cli.schema import TASKS
from convseq.common.config import PathsConfig, TrainerConfig, plain, typed
from convseq.data.config import BatchingConfig, DataConfig
from convseq.errors import SettingError
from convseq.evaluation.config import ReportConfig
from convseq.inference.options import GenConfig
from convseq.models.config import FConvConfig
from convseq.optim.config import AnnealConfig, OptimConfig
from convseq.tasks.config import TASK_CONFIGS, as_config
from convseq.training.config import AmpConfig, CheckpointConfig, CriterionConfig, TrainConfig
from tests.conftest import ROOT, compose_config

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
    "report": (ReportConfig, "convseq.evaluation.config"),
}


def test_each_group_is_typed_by_the_schema_of_its_own_layer():
    cfg = as_config(compose_config(["optim=adam", "anneal=inverse_sqrt"], output_dir="x"))
    assert type(cfg) is TrainConfig
    for group, (schema, module) in OWNERS.items():
        assert type(getattr(cfg, group)) is schema, group
        assert schema.__module__ == module, group
    # conf/optim/adam.yaml starts from Adam's own defaults, typed as every optimiser is
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.clip_norm) == ("adam", 0.001, 0.0)


def _groups(schema: type) -> set[type]:
    """The config dataclasses below a task's root, at any depth."""
    found = set()
    for f in dataclasses.fields(schema):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            found |= {type(default)} | _groups(type(default))
    return found


def test_no_schema_repeats_another_ones_fields():
    """One default per key: no two group schemas of src/ share three or more fields."""
    schemas = {g for root in TASK_CONFIGS.values() for g in _groups(root)}
    own = {s: {f.name for f in dataclasses.fields(s)} for s in schemas}
    for a in schemas:
        for b in schemas:
            if a is b or issubclass(a, b) or issubclass(b, a):
                continue
            shared = own[a] & own[b]
            assert len(shared) < 3, f"{a.__name__} and {b.__name__} both define {sorted(shared)}"


@pytest.mark.parametrize("task", TASKS)
def test_each_task_composes_only_its_own_schema(task):
    """conf/<task>.yaml holds its schema's keys, no others; the command line's typed object is
    what a Python caller builds from the same composition."""
    schema = TASK_CONFIGS[task]
    composed = compose_config([f"task={task}"], output_dir="out")
    assert set(composed) == {f.name for f in dataclasses.fields(schema)}
    cfg = as_config(composed)
    assert type(cfg) is schema and cfg.task == task
    own = schema(task=task, paths=PathsConfig(**plain(composed.paths)))
    if task == "train":  # the toy corpus and model the primary config chooses
        own = dataclasses.replace(own, data=cfg.data, model=cfg.model, batching=cfg.batching)
        own = dataclasses.replace(own, logger=cfg.logger)
    if task == "preprocess":
        own = dataclasses.replace(own, data=cfg.data)
    assert plain(cfg) == plain(own)


def test_a_checkpoint_task_says_where_its_data_comes_from(tmp_path):
    """--cfg job of task=generate shows the data it will use: the checkpoint's ({}), or the
    keys the command line changes; Python's composition says the same."""
    import subprocess
    import sys

    import yaml

    def cfg_job(*args: str) -> dict:
        out = subprocess.run(
            [sys.executable, "run.py", "task=generate", "ckpt=x.ckpt", *args, "--cfg", "job"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        return yaml.safe_load(out.stdout)

    assert cfg_job()["data"] == {} == plain(compose_config(["task=generate"]).data)
    moved = cfg_job("data.dir=/corpora/m30k")["data"]
    assert moved == {"dir": "/corpora/m30k"}
    assert plain(compose_config(["task=generate", "data.dir=/corpora/m30k"]).data) == moved


def test_dispatch_hands_the_task_the_composed_objects(monkeypatch):
    seen = {}
    monkeypatch.setattr(dispatch_module, "task_function", lambda t: lambda c: seen.update(cfg=c))
    dispatch_module.dispatch(compose_config(["optim.lr=0.5", "gen.beam=3"], output_dir="x"))
    cfg = seen["cfg"]
    assert type(cfg) is TrainConfig
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
    assert plain(one)["lr"] == 0.5 and plain(TrainConfig())["gen"]["beam"] == 5


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
