"""What `python run.py task=...` does: the task's `run_<task>` function over the typed config.

run.py stays a thin `@hydra.main`; each task is a module of `convseq.tasks` whose `run_<task>`
takes a `convseq.tasks.config.Config` (the composed config as dataclasses, every interpolation
resolved), so that tests and notebooks can call it without Hydra.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from convseq.cli.command_line import given_overrides, gives
from convseq.cli.config_check import check_keys
from convseq.cli.schema import TASKS
from convseq.common.config import plain
from convseq.common.tf32 import set_tf32
from convseq.errors import ConvseqError
from convseq.tasks.config import Config, as_config
from convseq.training.noise import quiet_third_party

__all__ = ["TASK_MODULES", "dispatch", "task_function"]


# task= value -> the module of convseq.tasks that runs it (its run_<task> function). Imported
# when the task runs, so that e.g. task=preprocess never loads Lightning.
TASK_MODULES: dict[str, str] = {task: f"convseq.tasks.{task}" for task in TASKS}

# Tasks that read a checkpoint: unless the command line sets `data` (or an `experiment`, which
# does), they get `data: None` and take the checkpoint's own data settings.
CHECKPOINT_TASKS = ("generate", "interactive", "average")


def task_function(task: str) -> Callable[..., Any]:
    """The function that runs `task` (``convseq.tasks.<task>.run_<task>``)."""
    module = importlib.import_module(TASK_MODULES[task])
    return getattr(module, f"run_{task}")


def checkpoint_data(cfg: Config, overrides: list) -> tuple[Config, dict[str, Any] | None]:
    """A checkpoint task takes its checkpoint's data unless the command line chooses a data
    option (`data=NAME`) or an experiment: then `data` becomes None, and the `data.KEY=...`
    keys it sets (e.g. `data.dir=` where the corpus is on this machine) are returned, nested
    (None when it sets none)."""
    if gives(overrides, "experiment") or any(o.key_or_group == "data" for o in overrides):
        return cfg, None
    keys = [o.key_or_group[5:] for o in overrides if gives([o], "data") and not o.is_delete()]
    data = plain(cfg.data)
    cfg = dataclasses.replace(cfg, data=None)
    return cfg, (nested({k: _select(data, k) for k in keys}) if keys else None)


def _select(tree: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """`{"a.b": 1}` -> `{"a": {"b": 1}}`."""
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        *parents, leaf = dotted.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def dispatch(cfg: DictConfig | Config | dict) -> Any:
    """Run `cfg.task`; a ConvseqError (bad input) is printed as one clear line, exit status 2.

    Every key must be one the schema knows (`convseq.cli.config_check`), whether it came with
    a `+` or not. The task gets the config typed (`convseq.tasks.config.as_config`). Under
    Hydra, a task of `CHECKPOINT_TASKS` whose command line chooses no data option receives
    `data: None` (the checkpoint's are used; `checkpoint_data`), and task=generate the
    `data.KEY=...` values the command line set as `data_overrides`.
    """
    quiet_third_party()  # before Lightning logs or warns: third-party noise, by its text
    try:
        if not isinstance(cfg, Config):
            check_keys(cfg)
        config = as_config(cfg)
        # every task, every rank (Lightning's DDP ranks run this too): CUDA fp32 products
        set_tf32(config.trainer.tf32)
        task = config.task
        if task not in TASK_MODULES:
            raise SystemExit(
                f"convseq: unknown task={task!r}; choose one of: {', '.join(sorted(TASK_MODULES))}"
            )
        overrides = given_overrides()
        extra: dict[str, Any] = {}
        if task in CHECKPOINT_TASKS and overrides is not None:
            config, data_overrides = checkpoint_data(config, overrides)
            if task == "generate":  # the only one that reads data beyond the checkpoint's
                extra["data_overrides"] = data_overrides
        return task_function(task)(config, **extra)
    except ConvseqError as e:
        print(f"convseq: error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
