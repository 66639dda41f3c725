"""What run.py reads from its command line before and beside Hydra.

- `check_command_line`: a misspelt key among the overrides fails at once, with the closest known
  keys (`optim.lrr`: did you mean `optim.lr`?), before Hydra's own message, whose hint
  (`To append to your config use +optim.lrr=0.1`) would lead to a key nothing reads; an
  unknown `task=` names the tasks.
- `main_guard`: run.py's check before Hydra, these and `convseq.cli.composition` (the config
  composed as Hydra will: an unknown group option, a value of the wrong type), each mistake
  one line on stderr and exit status 2.
- `task_of`: the task the command line names, whose primary config (conf/<task>.yaml) Hydra
  composes.
- `wants_no_run_folder`: `task=preprocess` writes into the shared cache only, so run.py composes
  its config without making a run folder.
- `check_plugins`: an option that needs a Hydra plugin from an optional extra
  (`hparams_search=...`, `hydra/launcher=slurm`) fails with the `pip install` line when the
  plugin is missing, instead of Hydra's "Could not find 'hydra/sweeper/optuna'".
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from omegaconf import DictConfig

from convseq.cli.composition import (
    ConfigValueError,
    check_composition,
    is_group_override,
    one_line,
)
from convseq.cli.config_check import ConfigKeyError, check_key, schema_tree
from convseq.cli.schema import config_name, open_node_args
from convseq.errors import ConvseqError
from convseq.tasks.config import TASK_CONFIGS

__all__ = [
    "NO_RUN_FOLDER_TASKS",
    "MissingPlugin",
    "check_command_line",
    "check_plugins",
    "parse_overrides",
    "task_of",
    "compose_without_run_folder",
    "wants_no_run_folder",
]

NO_RUN_FOLDER_TASKS = ("preprocess",)  # tasks that write nothing of their own into a run folder
# groups only task=train's primary config has (conf/train.yaml): a recipe sets training keys
TRAINING_ONLY_GROUPS = ("experiment", "hparams_search")
SCHEMAS = tuple(TASK_CONFIGS.values())
MULTIRUN_FLAGS = ("-m", "--multirun")
# Hydra's flags under which it composes another config, or none: its own messages
OWN_CONFIG_FLAGS = (
    "-h",
    "--help",
    "--hydra-help",
    "-i",
    "--info",
    "-sc",
    "--shell-completion",
    "-cp",
    "--config-path",
    "-cn",
    "--config-name",
    "-cd",
    "--config-dir",
    "--experimental-rerun",
)

# (group, option or None for any) -> the Hydra plugin module it needs and how to install it
PLUGINS = {
    ("hparams_search", None): ("hydra_plugins.hydra_optuna_sweeper", "pip install -e '.[sweep]'"),
    ("hydra/sweeper", "optuna"): (
        "hydra_plugins.hydra_optuna_sweeper",
        "pip install -e '.[sweep]'",
    ),
    ("hydra/launcher", "slurm"): (
        "hydra_plugins.hydra_submitit_launcher",
        "pip install -e '.[slurm]'",
    ),
    ("hydra/launcher", "submitit_local"): (
        "hydra_plugins.hydra_submitit_launcher",
        "pip install -e '.[slurm]'",
    ),
    ("hydra/launcher", "submitit_slurm"): (
        "hydra_plugins.hydra_submitit_launcher",
        "pip install -e '.[slurm]'",
    ),
    ("hydra/launcher", "joblib"): (
        "hydra_plugins.hydra_joblib_launcher",
        "pip install -e '.[sweep]'",
    ),
}


class MissingPlugin(ConvseqError):
    """An option that needs a Hydra plugin which is not installed."""


def override_args(argv: Sequence[str]) -> list[str]:
    """The overrides among run.py's arguments: `key=value` and `~key` (Hydra's flags and their
    values, such as `--cfg job` or `-cn NAME`, hold no `=`)."""
    return [a for a in argv if not a.startswith("-") and ("=" in a or a.startswith("~"))]


def parse_overrides(args: Sequence[str]) -> list[Override]:
    """Hydra's parse of override strings; [] when Hydra itself would refuse them (it then says
    why, better than we could)."""
    try:
        return OverridesParser.create().parse_overrides(list(args))
    except Exception:  # Hydra's OverrideParseException: left to Hydra's own message
        return []


def check_command_line(argv: Sequence[str], conf_dir: str | Path) -> None:
    """Refuse an override whose key the task's schema does not know (Hydra's own keys
    excepted), a group only another task's config has, and an unknown `task=`.

    Raises:
        ConfigKeyError: the key and the closest known ones, or the tasks whose key it is.
        ConfigValueError: an unknown task, the tasks and the closest.
    """
    task = task_of(argv)
    tree = schema_tree(TASK_CONFIGS[task])
    for override in parse_overrides(override_args(argv)):
        key = override.key_or_group
        if key in TRAINING_ONLY_GROUPS and task != "train":
            raise ConfigKeyError(
                f"{key}= chooses a training recipe or search, which task={task} does not read: "
                "leave it out; a corpus is named with data=NAME (the Multi30k recipes' data is "
                "data=multi30k_recipe), and generate, interactive and average take a "
                f"checkpoint's own data without it; `python run.py task={task} --cfg job` prints "
                f"the keys task={task} reads"
            )
        if key == "task" and not override.is_sweep_override():
            _check_task(str(override.value()))
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        if _chooses_family(key, task):
            raise ConfigKeyError(
                f"{key} comes with the preset, not on its own: choose a preset of the family "
                f"you want (model=NAME, e.g. model=lightconv_toy or model=fconv_toy; "
                "`python run.py --help` lists conf/model/)"
            )
        if not is_group_override(override, conf_dir):
            check_key(key, tree, task)
        elif (top := key.split("/")[0]) not in tree and any(top in schema_tree(s) for s in SCHEMAS):
            check_key(top, tree, task)  # optim=nag for task=report: a group of other tasks


def _chooses_family(key: str, task: str) -> bool:
    """Whether `key` is the `family` of a field typed by its value (`model.family`): a preset
    of one family cannot be turned into another's by that key alone."""
    top, _, rest = key.lstrip("+~").partition(".")
    fields = {f.name: f for f in dataclasses.fields(TASK_CONFIGS[task])}
    return rest == "family" and top in fields and "schema_of" in fields[top].metadata


def _check_task(name: str) -> None:
    if name not in TASK_CONFIGS:
        close = difflib.get_close_matches(name, list(TASK_CONFIGS), 3, 0.6)
        hint = f" (did you mean {' or '.join(f'task={c}' for c in close)}?)" if close else ""
        raise ConfigValueError(
            f"unknown task={name}{hint}: the tasks are {', '.join(TASK_CONFIGS)} "
            "(`python run.py --help` says what each does)"
        )


def task_of(argv: Sequence[str]) -> str:
    """The task the command line names (`task=NAME`; train where none is named), whose primary
    config (conf/<task>.yaml) Hydra composes."""
    return config_name(override_args(argv))


def wants_no_run_folder(argv: Sequence[str]) -> bool:
    """A single `task=preprocess` run (not a sweep, not a --cfg/--help/--info request)."""
    if any(a.startswith("-") for a in argv):
        return False
    tasks = [o for o in parse_overrides(override_args(argv)) if o.key_or_group == "task"]
    return bool(tasks) and str(tasks[-1].value()) in NO_RUN_FOLDER_TASKS


def compose_without_run_folder(argv: Sequence[str], conf_dir: str | Path) -> DictConfig:
    """conf/ composed with the overrides, as @hydra.main would, but with no run folder, no
    `.hydra/` and no log file (log lines go to the console): for a task that writes into the
    cache only (`paths.output_dir` is the cache)."""
    from hydra import compose, initialize_config_dir

    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
    )
    overrides = [*open_node_args(override_args(argv)), "paths.output_dir=${paths.cache_dir}"]
    try:
        with initialize_config_dir(config_dir=str(Path(conf_dir).absolute()), version_base="1.3"):
            cfg = compose(config_name=task_of(argv), overrides=overrides)
    except Exception as e:  # main_guard composed it already: Hydra's message, on one line
        print(f"convseq: error: {one_line(str(e))}", file=sys.stderr)
        raise SystemExit(2) from e
    return cfg


def check_plugins(argv: Sequence[str]) -> None:
    """Refuse an option whose Hydra plugin is not installed, naming the line that installs it.

    Raises:
        MissingPlugin: the option, the missing plugin and the `pip install` line.
    """
    for override in parse_overrides(override_args(argv)):
        group = override.key_or_group
        if override.is_delete() or override.value() is None:
            continue
        if override.value_type == ValueType.INTERVAL_SWEEP:  # a range of numbers, no option
            continue
        if override.is_sweep_override():  # hparams_search=a,b under -m
            options = list(override.sweep_string_iterator())
        else:
            options = [override.get_value_element_as_str()]
        for option in options:
            need = PLUGINS.get((group, option)) or PLUGINS.get((group, None))
            if need and importlib.util.find_spec(need[0]) is None:
                raise MissingPlugin(
                    f"{group}={option} needs the Hydra plugin {need[0]}, which is not "
                    f"installed: run {need[1]}"
                )


def main_guard(argv: Sequence[str], conf_dir: str | Path) -> None:
    """run.py's check before Hydra: a bad key, a missing plugin, an unknown group option, a
    value of the wrong type or any override Hydra would refuse (`convseq.cli.composition`,
    each value of a sweep under -m) prints one line and exits with status 2."""
    try:
        check_command_line(argv, conf_dir)
        check_plugins(argv)
        if not any(a.split("=", 1)[0] in OWN_CONFIG_FLAGS for a in argv):
            multirun = any(a in MULTIRUN_FLAGS for a in argv)
            check_composition(override_args(argv), conf_dir, multirun)
    except (ConfigKeyError, ConfigValueError, MissingPlugin) as e:
        print(f"convseq: error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
