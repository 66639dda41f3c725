"""The config of every task: one root dataclass per task, holding only the keys it uses.

`TrainConfig` (`convseq.training.config`) is task=train's; the others are here, with the groups
only they read (`report`, `average`, `import_fairseq`, `compare`). Each task has its primary
config in conf/ (conf/<task>.yaml) that starts from its schema; `python run.py task=NAME`
composes it (`convseq.cli.schema`) and hands the task the typed object (`OmegaConf.to_object`).
A Python caller composes the same file (`convseq.cli.schema.compose_task`) or builds the
dataclass itself; `as_config` types a DictConfig or a mapping by its `task` key.

The tasks that read a checkpoint (generate, interactive, average) hold `data` as the settings
given on the command line, typed when the task reads them (`convseq.inference.data_match`):
none (`{}`) means the checkpoint's own data; a data option (`data=NAME`, which sets
`data.name`) a corpus of its own, checked against the checkpoint's; keys alone
(`data.dir=...`) the checkpoint's data with those keys changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from convseq.common.config import DeviceConfig, PathsConfig, typed
from convseq.data.config import DataConfig
from convseq.errors import SettingError
from convseq.evaluation.config import ReportConfig
from convseq.inference.options import GenConfig
from convseq.optim.config import OptimConfig
from convseq.training.config import CriterionConfig, TrainConfig

__all__ = [
    "TASK_CONFIGS",
    "AverageConfig",
    "AverageTaskConfig",
    "CompareConfig",
    "CompareTaskConfig",
    "GenerateTaskConfig",
    "ImportFairseqConfig",
    "ImportFairseqTaskConfig",
    "PreprocessTaskConfig",
    "ReportConfig",
    "ReportTaskConfig",
    "TaskConfig",
    "as_config",
    "keys_schema",
    "task_name",
]

# the `data` node of a task that reads a checkpoint: open (keys alone are allowed), its keys
# still checked against DataConfig's on the command line (`convseq.cli.config_check`)
DATA_KEYS = {"schema": DataConfig}


def keys_schema(f: dataclasses.Field) -> type | None:
    """The schema whose keys the open field `f` takes (its metadata: `DATA_KEYS`), or None."""
    return f.metadata.get("schema")


@dataclass
class AverageConfig:
    """Checkpoint averaging (`task=average`)."""

    last_n: int = 0  # average the last N epochNNN.ckpt of the run folder in `ckpts` (0 = as listed)
    output: str | None = None  # the averaged checkpoint (default <output_dir>/averaged.ckpt)


@dataclass
class ImportFairseqConfig:
    """`task=import_fairseq ckpt=PATH`: convert a fairseq fconv or LightConv checkpoint to a convseq one."""

    dict_dir: str | None = None  # folder of dict.<lang>.txt (default: beside the checkpoint)
    output: str | None = None  # the converted checkpoint (default <output_dir>/imported.ckpt)


@dataclass
class CompareConfig:
    """`task=compare`: paired bootstrap resampling between systems' translations (convseq.tasks.compare)."""

    runs: list[str] = field(default_factory=list)  # run folders or hypothesis files, baseline first
    split: str = "test"  # run folders: their generate-<split>.txt
    refs: str | None = None  # reference file (default: the split's text in the data-bin of `data`)
    n_samples: int = 1000  # bootstrap resamples
    seed: int = 12345  # resampling seed (>= 1)


@dataclass
class GenerateTaskConfig:
    """task=generate (a split or a text file, scored) and task=interactive (stdin to stdout)."""

    task: str = "generate"  # generate | interactive
    paths: PathsConfig = field(default_factory=PathsConfig)
    # checkpoint(s): a .ckpt, a run folder, fairseq's .pt; ':' joins an ensemble
    ckpt: str | None = None
    # {} = the checkpoint's data; data=NAME = that corpus; data.KEY=... = the checkpoint's, changed
    data: Any = field(default_factory=dict, metadata=DATA_KEYS)
    gen: GenConfig = field(default_factory=GenConfig)
    trainer: DeviceConfig = field(default_factory=DeviceConfig)


@dataclass
class AverageTaskConfig:
    """task=average: average checkpoints (fairseq's average_checkpoints)."""

    task: str = "average"
    paths: PathsConfig = field(default_factory=PathsConfig)
    # checkpoint files, or [RUN_DIR] with average.last_n
    ckpts: list[str] = field(default_factory=list)
    average: AverageConfig = field(default_factory=AverageConfig)
    # {} = the inputs' own; data=NAME = the corpus every input must have been trained on
    data: Any = field(default_factory=dict, metadata=DATA_KEYS)


@dataclass
class CompareTaskConfig:
    """task=compare: BLEU with 95% intervals and paired bootstrap between systems."""

    task: str = "compare"
    paths: PathsConfig = field(default_factory=PathsConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    # the references when compare.refs is unset: the split's text of this corpus (data=NAME)
    data: Any = field(default_factory=dict, metadata=DATA_KEYS)
    gen: GenConfig = field(default_factory=GenConfig)  # gen.tokenize: sacreBLEU's tokenizer


@dataclass
class ReportTaskConfig:
    """task=report: the summary table and curves of a sweep."""

    task: str = "report"
    paths: PathsConfig = field(default_factory=PathsConfig)
    sweep_dir: str | None = None  # the multirun folder (its hydra.sweep.dir)
    report: ReportConfig = field(default_factory=ReportConfig)


@dataclass
class PreprocessTaskConfig:
    """task=preprocess: segment and binarise a corpus into the shared cache."""

    task: str = "preprocess"
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)


@dataclass
class ImportFairseqTaskConfig:
    """task=import_fairseq: a fairseq fconv or LightConv checkpoint as a convseq one."""

    task: str = "import_fairseq"
    paths: PathsConfig = field(default_factory=PathsConfig)
    ckpt: str | None = None  # fairseq's checkpoint (checkpoint_best.pt, model.pt)
    import_fairseq: ImportFairseqConfig = field(default_factory=ImportFairseqConfig)
    # kept in the converted checkpoint, for fine-tuning from it
    optim: OptimConfig = field(default_factory=OptimConfig)
    criterion: CriterionConfig = field(default_factory=CriterionConfig)


TaskConfig = (
    TrainConfig
    | GenerateTaskConfig
    | AverageTaskConfig
    | CompareTaskConfig
    | ReportTaskConfig
    | PreprocessTaskConfig
    | ImportFairseqTaskConfig
)

# task= value -> its config's schema (conf/<task>.yaml starts from it)
TASK_CONFIGS: dict[str, type] = {
    "train": TrainConfig,
    "preprocess": PreprocessTaskConfig,
    "generate": GenerateTaskConfig,
    "interactive": GenerateTaskConfig,
    "average": AverageTaskConfig,
    "compare": CompareTaskConfig,
    "report": ReportTaskConfig,
    "import_fairseq": ImportFairseqTaskConfig,
}


def task_name(cfg: Any) -> str:
    """The task a config is for: its `task` key (train's where it has none)."""
    if isinstance(cfg, DictConfig):
        task = OmegaConf.select(cfg, "task")
    elif isinstance(cfg, Mapping):
        task = next((value for key, value in cfg.items() if key == "task"), None)
    else:
        task = getattr(cfg, "task", None)
    return str(task or TrainConfig.task)


def as_config(cfg: Any) -> Any:
    """`cfg` as its task's config: a task config as it is; a DictConfig or a mapping typed by
    the schema its `task` key names (default train), every interpolation resolved, an unknown
    key or a wrong type refused by name."""
    if isinstance(cfg, tuple(TASK_CONFIGS.values())):
        return cfg
    task = task_name(cfg)
    if task not in TASK_CONFIGS:
        raise SettingError(f"task={task!r}; choose one of: {', '.join(TASK_CONFIGS)}")
    return typed(TASK_CONFIGS[task], cfg, "config")
