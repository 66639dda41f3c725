"""The structured-config schema behind conf/: unknown keys and wrong types fail at composition.

`register_configs()` stores the root schema in Hydra's ConfigStore as `config_schema`;
conf/config.yaml extends it explicitly in its defaults list, so every group option (a YAML file
under conf/<group>/) is merged onto a typed node and checked by Hydra itself. It also stores each
optimiser's defaults (`convseq.optim.config.OPTIMIZER_DEFAULTS`) as `optim/defaults/<name>`, which
conf/optim/<name>.yaml starts from.
"""

from __future__ import annotations

import os
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from convseq.optim.config import OPTIMIZER_DEFAULTS
from convseq.tasks.config import Config

# task= value -> what it does, in one line (`python run.py --help` lists them)
TASK_HELP = {
    "train": "train a model (the default); resume=auto continues the run in its folder",
    "preprocess": "segment and binarise `data` into the shared cache (no run folder)",
    "generate": "translate a split or gen.input=FILE with ckpt=..., write hypotheses, score BLEU",
    "interactive": "translate stdin line by line with ckpt=...",
    "average": "average checkpoints: ckpts=[RUN_DIR] average.last_n=5 (fairseq's average)",
    "compare": "BLEU with 95% intervals and paired bootstrap p: compare.runs=[RUN_A,RUN_B]",
    "report": "the summary table and curves of a sweep: sweep_dir=multirun/...",
    "import_fairseq": "convert a fairseq fconv checkpoint (ckpt=checkpoint_best.pt) to convseq's",
}
TASKS = tuple(TASK_HELP)


def default_cache_dir() -> str:
    """The per-user cache folder: $XDG_CACHE_HOME/convseq, else ~/.cache/convseq."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "convseq")


def _abspath(path: str) -> str:
    return str(Path(os.path.expanduser(str(path))).absolute())


def task_folder(task: str) -> str:
    """The part of a run folder's path that names its task: none for train (`outputs/DATE/TIME`),
    `<task>/` for the others (`outputs/generate/DATE/TIME`)."""
    return "" if task == "train" else f"{task}/"


def task_help() -> str:
    """The tasks, one line each, for `python run.py --help`."""
    width = max(len(t) for t in TASK_HELP)
    return "\n".join(f"  {task:<{width}}  {line}" for task, line in TASK_HELP.items())


def register_configs() -> None:
    """Register the schema and resolvers; idempotent, call before composing conf/."""
    resolvers = (
        ("abspath", _abspath),
        ("convseq_user_cache", default_cache_dir),
        ("convseq_task_folder", task_folder),
        ("convseq_task_help", task_help),
    )
    for name, fn in resolvers:
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    for name, defaults in OPTIMIZER_DEFAULTS.items():  # what conf/optim/<name>.yaml starts from
        store.store(group="optim/defaults", name=name, node=defaults)
