"""The structured-config schemas behind conf/: unknown keys and wrong types fail at composition.

Each task has its primary config, conf/<task>.yaml, composed from the groups it uses.
`register_configs()` stores each task's schema (`convseq.tasks.config.TASK_CONFIGS`) in
Hydra's ConfigStore as `<task>_schema`; the task's primary config extends it in its defaults
list, so every group option (a YAML file under conf/<group>/) is merged onto a typed node and
checked by Hydra itself. `compose_task` composes a task's config as `python run.py` does. It also stores each
optimiser's defaults (`convseq.optim.config.OPTIMIZER_DEFAULTS`) as `optim/defaults/<name>`, which
conf/optim/<name>.yaml starts from.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from convseq.models.family import FAMILIES
from convseq.optim.config import OPTIMIZER_DEFAULTS
from convseq.tasks.config import TASK_CONFIGS, keys_schema

# task= value -> what it does, in one line (`python run.py --help` lists them)
TASK_HELP = {
    "train": "train a model (the default); resume=auto continues the run in its folder",
    "preprocess": "segment and binarise `data` into the shared cache (no run folder)",
    "generate": "translate a split or gen.input=FILE with ckpt=..., write hypotheses, score BLEU",
    "interactive": "translate stdin line by line with ckpt=...",
    "average": "average checkpoints: ckpts=[RUN_DIR] average.last_n=5 (fairseq's average)",
    "compare": "BLEU with 95% intervals and paired bootstrap p: compare.runs=[RUN_A,RUN_B]",
    "report": "the summary table and curves of a sweep: sweep_dir=multirun/...",
    "import_fairseq": "convert a fairseq fconv or LightConv checkpoint (ckpt=checkpoint_best.pt) to convseq's",
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
    for task, schema in TASK_CONFIGS.items():  # what conf/<task>.yaml starts from
        store.store(name=f"{task}_schema", node=_open_family_nodes(schema))
    for family in FAMILIES.values():  # what conf/model/<preset>.yaml starts from
        store.store(group="model/schema", name=family.name, node=family.config)
    for name, defaults in OPTIMIZER_DEFAULTS.items():  # what conf/optim/<name>.yaml starts from
        store.store(group="optim/defaults", name=name, node=defaults)


def _open_family_nodes(schema: type) -> DictConfig:
    """`schema` as a node whose fields that hold a family's config (`MODEL_KEYS`) are left
    unset, so that the preset's own schema (``schema/<family>@_here_`` in its defaults list)
    types them: a LightConv preset is not merged onto FConvConfig's keys."""
    node = OmegaConf.structured(schema)
    for f in dataclasses.fields(schema):
        if "schema_of" in f.metadata:
            node[f.name] = MISSING
    return node


def config_name(overrides: Sequence[str]) -> str:
    """The primary config (conf/<name>.yaml) of the task that `task=...` among `overrides`
    names; train's where none does."""
    tasks = [o.split("=", 1)[1] for o in overrides if o.startswith("task=")]
    return tasks[-1] if tasks and tasks[-1] in TASKS else "train"


def open_node_args(args: Sequence[str]) -> list[str]:
    """`args` with Hydra's `++` added to each `KEY=VALUE` below an open node whose keys a
    schema still names (the `data` of a task that reads a checkpoint: `data.dir=FOLDER` alone
    changes the checkpoint's data settings). Hydra adds keys to an open node only with `+`;
    `convseq.cli.config_check` has checked them against the node's schema either way."""
    task = config_name(args)
    schema = TASK_CONFIGS[task]
    prefixes = tuple(f"{f.name}." for f in dataclasses.fields(schema) if keys_schema(f) is not None)
    if not prefixes:
        return list(args)
    return [
        f"++{a}" if "=" in a and not a.startswith(("+", "~", "-")) and a.startswith(prefixes) else a
        for a in args
    ]


def compose_task(
    conf_dir: str | Path, overrides: Sequence[str] = (), output_dir: str | None = None
) -> DictConfig:
    """The composed config of the task that `overrides` name (`task=NAME`, else train), as
    `python run.py` composes it, without a run folder (`paths.output_dir` is `output_dir`, or
    unset). Hydra's own checks apply; the key check of `convseq.cli.config_check` is the
    caller's (`convseq.cli.dispatch.dispatch` does it)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(conf_dir).absolute()), version_base="1.3"):
        cfg = compose(config_name=config_name(overrides), overrides=open_node_args(overrides))
    if output_dir is not None:
        cfg.paths.output_dir = output_dir
    return cfg
