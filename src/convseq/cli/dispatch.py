"""What `python run.py task=...` does: the task's `run_<task>` function over the plain config.

run.py stays a thin `@hydra.main`; each task is a module of `convseq.tasks` whose `run_<task>`
takes plain (resolved) values, so that tests and notebooks can call it without Hydra.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from convseq.cli.command_line import given_overrides, gives
from convseq.cli.config_check import check_keys
from convseq.cli.schema import TASKS
from convseq.common.plain import to_plain
from convseq.common.tf32 import set_tf32
from convseq.errors import ConvseqError
from convseq.training.noise import quiet_third_party

# to_plain is convseq.common.plain's, importable here too (scripts and notebooks use it)
__all__ = ["TASK_MODULES", "dispatch", "task_function", "to_plain"]


# task= value -> the module of convseq.tasks that runs it (its run_<task> function). Imported
# when the task runs, so that e.g. task=preprocess never loads Lightning.
TASK_MODULES: dict[str, str] = {task: f"convseq.tasks.{task}" for task in TASKS}

# Tasks that read a checkpoint: unless the command line sets `data` (or an `experiment`, which
# does), they get `data: None` and take the checkpoint's own data settings.
CHECKPOINT_TASKS = ("generate", "interactive", "average")


def task_function(task: str) -> Callable[[dict[str, Any]], Any]:
    """The function that runs `task` (``convseq.tasks.<task>.run_<task>``)."""
    module = importlib.import_module(TASK_MODULES[task])
    return getattr(module, f"run_{task}")


def _checkpoint_data(plain: dict[str, Any], overrides: list) -> None:
    """A checkpoint task takes its checkpoint's data unless the command line chooses a data
    option (`data=NAME`) or an experiment: then `data` is None, and the `data.KEY=...` keys it
    sets (e.g. `data.dir=` where the corpus is on this machine) go to `data_overrides`."""
    if gives(overrides, "experiment") or any(o.key_or_group == "data" for o in overrides):
        return
    keys = [o.key_or_group[5:] for o in overrides if gives([o], "data") and not o.is_delete()]
    data, plain["data"] = plain["data"], None
    if keys:
        plain["data_overrides"] = nested({k: _select(data, k) for k in keys})


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


def dispatch(cfg: DictConfig | dict) -> Any:
    """Run `cfg.task`; a ConvseqError (bad input) is printed as one clear line, exit status 2.

    Every key must be one the schema knows (`convseq.cli.config_check`), whether it came with
    a `+` or not. Under Hydra, a task of `CHECKPOINT_TASKS` whose command line chooses no data
    option receives `data: None` (the checkpoint's are used; `_checkpoint_data`).
    """
    quiet_third_party()  # before Lightning logs or warns: third-party noise, by its text
    try:
        check_keys(cfg)
        plain = to_plain(cfg)
        # every task, every rank (Lightning's DDP ranks run this too): CUDA fp32 products
        set_tf32(bool((plain.get("trainer") or {}).get("tf32", True)))
        task = plain["task"]
        if task not in TASK_MODULES:
            raise SystemExit(
                f"convseq: unknown task={task!r}; choose one of: {', '.join(sorted(TASK_MODULES))}"
            )
        overrides = given_overrides()
        if task in CHECKPOINT_TASKS and overrides is not None:
            _checkpoint_data(plain, overrides)
        function = task_function(task)
        return function(plain)
    except ConvseqError as e:
        print(f"convseq: error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
