"""What `python run.py task=...` does: the task's `run_<task>` function over its typed config.

run.py stays a thin `@hydra.main` over the task's primary config (conf/<task>.yaml); each task
is a module of `convseq.tasks` whose `run_<task>` takes its config dataclass
(`convseq.tasks.config`, every interpolation resolved), so that tests and notebooks can call it
without Hydra and get what the command line gets.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig

from convseq.cli.config_check import check_keys, schema_tree
from convseq.cli.schema import TASKS
from convseq.common.tf32 import set_tf32
from convseq.errors import ConvseqError
from convseq.tasks.config import TASK_CONFIGS, as_config, task_name
from convseq.training.noise import quiet_third_party

__all__ = ["TASK_MODULES", "dispatch", "task_function"]


# task= value -> the module of convseq.tasks that runs it (its run_<task> function). Imported
# when the task runs, so that e.g. task=preprocess never loads Lightning.
TASK_MODULES: dict[str, str] = {task: f"convseq.tasks.{task}" for task in TASKS}


def task_function(task: str) -> Callable[..., Any]:
    """The function that runs `task` (``convseq.tasks.<task>.run_<task>``)."""
    module = importlib.import_module(TASK_MODULES[task])
    return getattr(module, f"run_{task}")


def dispatch(cfg: DictConfig | Mapping[str, Any] | Any) -> Any:
    """Run `cfg.task`; a ConvseqError (bad input) is printed as one clear line, exit status 2.

    A composed config (a DictConfig) or a mapping has each of its keys checked against the
    task's schema (`convseq.cli.config_check`: a misspelt key fails, `+` or not) and is typed
    (`convseq.tasks.config.as_config`); a task config dataclass is run as it is.
    """
    quiet_third_party()  # before Lightning logs or warns: third-party noise, by its text
    try:
        if isinstance(cfg, (DictConfig, Mapping)):
            task = task_name(cfg)
            if task not in TASK_MODULES:
                raise SystemExit(
                    f"convseq: unknown task={task!r}; choose one of: "
                    f"{', '.join(sorted(TASK_MODULES))}"
                )
            check_keys(cfg, schema_tree(TASK_CONFIGS[task], cfg), task)
        config = as_config(cfg)
        trainer = getattr(config, "trainer", None)
        if trainer is not None:  # every rank too (Lightning's DDP ranks run this): CUDA fp32
            set_tf32(trainer.tf32)
        return task_function(config.task)(config)
    except ConvseqError as e:
        print(f"convseq: error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
