"""The config of every task: `Config`, the root the command line composes, and the groups of
the tasks other than training (`report`, `average`, `import_fairseq`, `compare`).

`Config` is `TrainConfig` (`convseq.training.config`: what a training run reads) with the other
tasks' keys. The command line hands a task a `Config` (`OmegaConf.to_object` of the composed
config, `convseq.cli.dispatch`); a Python caller may hand it a mapping, which `as_config` checks
and types the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from convseq.common.config import typed
from convseq.data.config import DataConfig
from convseq.training.config import TrainConfig

__all__ = [
    "AverageConfig",
    "CompareConfig",
    "Config",
    "ImportFairseqConfig",
    "ReportConfig",
    "as_config",
]


@dataclass
class ReportConfig:
    """The sweep summary (`task=report`, and after every multirun)."""

    test: bool = False  # also list test figures (settings are chosen on validation)
    x: str = "epoch"  # epoch | updates: what sweep_curves.png is drawn against


@dataclass
class AverageConfig:
    """Checkpoint averaging (`task=average`)."""

    last_n: int = 0  # average the last N epochNNN.ckpt of the run folder in `ckpts` (0 = as listed)
    output: str | None = None  # the averaged checkpoint (default <output_dir>/averaged.ckpt)


@dataclass
class ImportFairseqConfig:
    """`task=import_fairseq ckpt=PATH`: convert a fairseq fconv checkpoint to a convseq one."""

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
class Config(TrainConfig):
    """The root of every composed configuration: a training run's keys and the other tasks'."""

    # a checkpoint task (generate, interactive, average) whose command line names no data
    # receives None here and takes the checkpoint's data settings
    data: DataConfig | None = field(default_factory=DataConfig)
    ckpt: str | None = None  # a checkpoint to load (generate, interactive, import_fairseq)
    sweep_dir: str | None = None  # task=report: the multirun folder to summarise
    report: ReportConfig = field(default_factory=ReportConfig)
    ckpts: list[str] = field(default_factory=list)  # task=average: checkpoints (or a run folder)
    average: AverageConfig = field(default_factory=AverageConfig)
    import_fairseq: ImportFairseqConfig = field(default_factory=ImportFairseqConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)


def as_config(cfg: Config | DictConfig | Mapping[str, Any]) -> Config:
    """`cfg` as a `Config`: returned as it is, or checked and typed from a DictConfig or a
    plain mapping (every interpolation resolved; an unknown key or a wrong type is refused,
    naming the key)."""
    return typed(Config, cfg, "config")
