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

from convseq.common.plain import to_plain
from convseq.errors import ConvseqError
from convseq.tasks.schema import TASKS

# to_plain is convseq.common.plain's, importable here too (scripts and notebooks use it)
__all__ = ["TASK_MODULES", "dispatch", "task_function", "to_plain"]


# task= value -> the module of convseq.tasks that runs it (its run_<task> function). Imported
# when the task runs, so that e.g. task=preprocess never loads Lightning.
TASK_MODULES: dict[str, str] = {task: f"convseq.tasks.{task}" for task in TASKS}


def task_function(task: str) -> Callable[[dict[str, Any]], Any]:
    """The function that runs `task` (``convseq.tasks.<task>.run_<task>``)."""
    module = importlib.import_module(TASK_MODULES[task])
    return getattr(module, f"run_{task}")


def dispatch(cfg: DictConfig | dict) -> Any:
    """Run `cfg.task`; a ConvseqError (bad input) is printed as one clear line, exit status 2."""
    plain = to_plain(cfg)
    task = plain["task"]
    if task not in TASK_MODULES:
        raise SystemExit(
            f"convseq: unknown task={task!r}; choose one of: {', '.join(sorted(TASK_MODULES))}"
        )
    function = task_function(task)
    try:
        return function(plain)
    except ConvseqError as e:
        print(f"convseq: error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
