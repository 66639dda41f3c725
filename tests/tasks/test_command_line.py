"""The command line a user types: misspelt keys (with or without +), the data a checkpoint task
is given, the run folder each task makes, and `--help`."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

import convseq.cli.command_line as command_line_module
import convseq.cli.dispatch as dispatch_module
from convseq.cli.command_line import (
    MissingPlugin,
    check_command_line,
    check_plugins,
    override_args,
    task_of,
    wants_no_run_folder,
)
from convseq.cli.config_check import ConfigKeyError, check_keys, schema_tree, suggestions
from convseq.cli.schema import config_name, register_configs
from convseq.tasks.config import GenerateTaskConfig
from convseq.training.config import TrainConfig
from tests.conftest import CONF_DIR, ROOT, compose_config

TRAIN_KEYS = schema_tree(TrainConfig)  # the keys of task=train's config (conf/train.yaml)


def run_py(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`python run.py ARGS` in an empty working folder, outputs and cache under tmp_path."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "CONVSEQ_CACHE": str(tmp_path / "cache"),
        "CONVSEQ_OUTPUTS": str(tmp_path / "outputs"),
        **env,
    }
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


# ---------------------------------------------------------------------------- misspelt keys


@pytest.mark.parametrize("key", ["optim.lrr=0.1", "+optim.lrr=0.1", "++optim.lrr=0.1"])
def test_a_misspelt_key_fails_with_or_without_plus_and_names_the_right_one(key, capsys):
    with pytest.raises(SystemExit) as e:
        command_line_module.main_guard([key, "trainer.max_epochs=1"], CONF_DIR)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("convseq: error: unknown config key optim.lrr (did you mean optim.lr?)")
    assert err.count("\n") == 1, err  # one line


def test_a_misspelt_key_fails_in_run_py_before_anything_runs(tmp_path):
    proc = run_py(["+optim.lrr=0.1", "trainer.max_epochs=1"], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unknown config key optim.lrr (did you mean optim.lr?)" in proc.stderr
    assert "To append to your config use +" not in proc.stderr  # Hydra's hint leads astray
    assert not (tmp_path / "outputs").exists(), "nothing trained, no run folder"


def test_a_plus_key_in_the_composed_config_is_refused_after_composition():
    cfg = compose_config(["+optim.lrr=0.1"])
    assert OmegaConf.select(cfg, "optim.lrr") == 0.1  # Hydra let it in
    with pytest.raises(ConfigKeyError, match=r"optim\.lrr \(did you mean optim\.lr\?\)"):
        check_keys(cfg, TRAIN_KEYS)
    with pytest.raises(SystemExit) as e:
        dispatch_module.dispatch(cfg)
    assert e.value.code == 2


def test_open_nodes_take_new_keys():
    cfg = compose_config(["+data.test_sets.flickr=test_2017_flickr", "trainer.devices=[0,1]"])
    check_keys(cfg, TRAIN_KEYS)  # no error: data.test_sets is a dict, trainer.devices is Any
    check_command_line(["+data.test_sets.flickr=x", "resume=auto"], CONF_DIR)


def test_a_new_top_level_group_is_not_a_key_the_schema_has():
    with pytest.raises(ConfigKeyError, match="unknown config key mygroup"):
        check_keys({"task": "train", "mygroup": {"a": 1}}, TRAIN_KEYS)


def test_group_choices_and_hydra_keys_are_not_checked_as_keys():
    argv = ["-m", "optim=nag,sgd", "hydra/launcher=basic", "hydra.run.dir=x", "experiment=null"]
    check_command_line([*argv, "--cfg", "job"], CONF_DIR)
    with pytest.raises(ConfigKeyError, match="trainr.max_epochs"):
        check_command_line(["optim=nag", "trainr.max_epochs=3"], CONF_DIR)


def test_suggestions_look_at_siblings_then_at_every_key():
    tree = TRAIN_KEYS
    assert suggestions("optim.lrr", tree)[0] == "optim.lr"
    assert suggestions("trainer.lr", tree) == ["optim.lr"]  # no sibling close: the same leaf
    assert suggestions("trainr.max_epochs", tree) == ["trainer.max_epochs"]
    assert suggestions("qqqqqq.zzzzz", tree) == []


@pytest.mark.parametrize("group", ["anneal", "batching", "data", "model", "optim", "trainer"])
def test_every_option_of_every_group_passes_the_key_check(group):
    for option in sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")):
        check_keys(compose_config([f"{group}={option}"]), TRAIN_KEYS)


def test_every_experiment_passes_the_key_check():
    for option in sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")):
        check_keys(compose_config([f"experiment={option}"]), TRAIN_KEYS)


# ---------------------------------------------------------------------------- data given or not


def test_a_training_recipe_is_refused_on_a_checkpoint_tasks_command_line():
    # experiment= and hparams_search= are train's; a checkpoint task names its data with data=
    check_command_line(["experiment=multi30k_fconv"], CONF_DIR)
    for task in ("generate", "interactive", "average"):
        with pytest.raises(ConfigKeyError, match=rf"experiment= .* task={task} does not read"):
            check_command_line([f"task={task}", "experiment=multi30k_fconv"], CONF_DIR)
    assert task_of(["task=generate", "gen.beam=2"]) == "generate"
    assert task_of(["gen.beam=2"]) == "train"


def _dispatched(monkeypatch, cfg: Any) -> Any:
    """The typed config the task function gets when `cfg` is dispatched."""
    seen: list = []
    monkeypatch.setattr(dispatch_module, "task_function", lambda t: lambda c, **kw: seen.append(c))
    dispatch_module.dispatch(cfg)
    [given] = seen
    return given


def _dispatch_under(monkeypatch, overrides: list[str], task: str) -> Any:
    """The typed config the task function gets when the command line held `overrides`."""
    return _dispatched(monkeypatch, compose_config([f"task={task}", *overrides], output_dir="x"))


def test_a_checkpoint_tasks_data_says_where_its_data_comes_from(monkeypatch):
    # no data on the command line: {} (the checkpoint's own data)
    cfg = _dispatch_under(monkeypatch, ["gen.beam=2"], "generate")
    assert isinstance(cfg, GenerateTaskConfig) and cfg.data == {} and cfg.gen.beam == 2
    assert _dispatch_under(monkeypatch, ["gen.beam=2"], "interactive").data == {}
    assert _dispatch_under(monkeypatch, [], "average").data == {}
    # a data option: that corpus
    assert _dispatch_under(monkeypatch, ["data=multi30k"], "generate").data["name"] == "multi30k"
    # keys alone: the checkpoint's data, with the keys the user set on it
    moved = _dispatch_under(
        monkeypatch, ["data.dir=/corpora/m30k", "+data.test_sets.a=b"], "generate"
    )
    assert moved.data == {"dir": "/corpora/m30k", "test_sets": {"a": "b"}}
    train = _dispatch_under(monkeypatch, ["gen.beam=2"], "train")
    assert isinstance(train, TrainConfig) and train.data.name == "toy"
    # a Python caller's typed config is handed over as it is
    assert _dispatched(monkeypatch, cfg) is cfg


# ---------------------------------------------------------------------------- run folders, help


def test_only_a_single_preprocess_run_goes_without_a_run_folder():
    assert wants_no_run_folder(["task=preprocess", "data=multi30k"])
    assert not wants_no_run_folder(["task=preprocess", "--cfg", "job"])
    assert not wants_no_run_folder(["-m", "task=preprocess"])
    assert not wants_no_run_folder(["task=train"])
    assert override_args(["-cn", "config", "--cfg", "job", "a=1", "~b"]) == ["a=1", "~b"]


def _run_dir(overrides: list[str]) -> str:
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name(overrides), overrides=overrides, return_hydra_config=True)
    return str(cfg.hydra.run.dir)


def test_each_task_but_train_runs_in_a_folder_named_after_it(monkeypatch):
    monkeypatch.setenv("CONVSEQ_OUTPUTS", "out")
    train = _run_dir([]).split("/")
    assert train[0] == "out" and len(train) == 3  # out/DATE/TIME, as always
    for task in ("generate", "average", "compare", "interactive", "report", "import_fairseq"):
        parts = _run_dir([f"task={task}"]).split("/")
        assert parts[:2] == ["out", task] and len(parts) == 4
        assert [len(p) for p in parts[2:]] == [len(p) for p in train[1:]]  # DATE/TIME


def test_help_lists_every_task_with_a_line(tmp_path):
    proc = run_py(["--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    tasks = text.split("== Tasks (task=...")[1].split("==")[1]
    lines = [line.split(None, 1) for line in tasks.strip().splitlines()]
    names = [parts[0] for parts in lines]
    assert set(names) == set(dispatch_module.TASK_MODULES)
    assert all(len(parts) == 2 and len(parts[1]) > 20 for parts in lines)
    assert "model: fconv," in text  # the groups are still listed
    assert not (tmp_path / "outputs").exists()


def test_an_option_whose_hydra_plugin_is_missing_names_the_install_line(monkeypatch, capsys):
    missing = ("hydra_plugins.convseq_no_such_plugin", "pip install -e '.[nothing]'")
    monkeypatch.setattr(command_line_module, "PLUGINS", {("hparams_search", None): missing})
    with pytest.raises(
        MissingPlugin, match=r"hparams_search=b needs .*no_such_plugin.*\[nothing\]"
    ):
        check_plugins(["-m", "hparams_search=b", "optim.lr=0.1"])
    with pytest.raises(MissingPlugin, match="hparams_search=a needs"):  # a sweep: each option
        check_plugins(["-m", "hparams_search=a,b"])
    check_plugins(["optim=sgd", "~hparams_search"])  # other groups, a deletion: nothing needed
    with pytest.raises(SystemExit) as e:
        command_line_module.main_guard(["hparams_search=toy_optuna"], CONF_DIR)
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("convseq: error: hparams_search=toy_optuna needs")


def test_installed_plugins_pass_and_each_known_option_names_its_extra():
    plugins = command_line_module.PLUGINS
    assert plugins[("hparams_search", None)][1].endswith("'.[sweep]'")
    assert plugins[("hydra/launcher", "slurm")][1].endswith("'.[slurm]'")
    if importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is None:
        pytest.skip("the sweep extra is not installed")
    check_plugins(["-m", "hparams_search=toy_optuna"])  # no error: the plugin is there
