"""The schemas of what a training run reads: the `criterion`, `amp` and `checkpoint` groups, and
`TrainConfig`, the whole config of `task=train` (every group it uses, typed).

A training run (`convseq.tasks.train.train`) receives one `TrainConfig`; its parts go to the
layers that own their schemas: `optim` and `anneal` to `convseq.optim`, `model` to
`convseq.models`, `data` and `batching` to `convseq.data`, `gen` to `convseq.inference`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from convseq.common.config import PathsConfig, TrainerConfig
from convseq.data.config import BatchingConfig, DataConfig
from convseq.evaluation.config import ReportConfig
from convseq.inference.options import GenConfig
from convseq.models.config import FConvConfig
from convseq.models.family import MODEL_KEYS
from convseq.optim.config import AnnealConfig, OptimConfig

__all__ = ["AmpConfig", "CheckpointConfig", "CriterionConfig", "TrainConfig"]


@dataclass
class CriterionConfig:
    """The training loss (label-smoothed cross entropy; epsilon 0 = plain cross entropy)."""

    label_smoothing: float = 0.0
    normalize: str = "tokens"  # tokens | sentences: what gradients are divided by


@dataclass
class AmpConfig:
    """fp16 loss scaling with trainer.precision=16-mixed (fairseq's --fp16 flags)."""

    init_scale: float = 128.0  # fairseq's --fp16-init-scale
    scale_window: int | None = None  # --fp16-scale-window (None: 2**14 / processes / accumulation)
    min_scale: float = 1e-4  # --min-loss-scale: stop with an error below it


@dataclass
class CheckpointConfig:
    """What is saved in `<output_dir>/checkpoints/` (conf/config.yaml `checkpoint:`)."""

    monitor: str = "valid/loss"  # metric that picks best.ckpt
    mode: str = "min"  # min | max: whether a lower or a higher monitor value is better
    save_last: bool = True  # last.ckpt after every epoch (what resume=true continues from)
    keep_epochs: int = 0  # also keep epochNNN.ckpt for the last N epochs (0 = none, -1 = all)
    keep_interval_updates: int = -1  # how many updateUUUUUUU.ckpt to keep (-1 = all)


@dataclass
class TrainConfig:
    """Everything `task=train` reads: the root of a training run's config."""

    task: str = "train"  # the task this config is for (python run.py task=...)
    seed: int = 1  # fairseq's --seed: model init, batch order (seed + epoch)
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    # any family's config (FConvConfig, LightConvConfig): its keys are those of the family the
    # preset names (`convseq.models.family`)
    model: Any = field(default_factory=FConvConfig, metadata=MODEL_KEYS)
    optim: OptimConfig = field(default_factory=OptimConfig)
    anneal: AnnealConfig = field(default_factory=AnnealConfig)
    criterion: CriterionConfig = field(default_factory=CriterionConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    amp: AmpConfig = field(default_factory=AmpConfig)
    # false | true (continue paths.output_dir) | auto (continue it if it can) | a run folder or
    # a checkpoint file
    resume: Any = False
    max_update: int = 0  # stop after this many updates (0 = no limit; fairseq's --max-update)
    patience: int = -1  # stop after N validations without improvement (-1 = off)
    optimized_metric: str = "valid/loss"  # what train() returns to sweepers (its best value)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    gen: GenConfig = field(default_factory=GenConfig)
    # validation BLEU every N epochs (0 = off; None: off, or every epoch when the checkpoint or
    # the sweep goes by valid/bleu)
    bleu_every_n_epochs: int | None = None
    validate_interval_updates: int = 0  # validate every N updates instead of every epoch (0 = off)
    save_interval_updates: int = 0  # checkpoints/updateUUUUUUU.ckpt every N updates (0 = off)
    profile: bool = False  # print where each training epoch's time goes
    final_test: bool = True  # test loss (and gen.test_bleu) of best.ckpt at the end
    # the sweep report written after a multirun (-m) of training runs (task=report's too)
    report: ReportConfig = field(default_factory=ReportConfig)
    # conf/logger: the experiment tracker(s), one `_target_` entry or a dict of them (open node)
    logger: Any = None
    # conf/callbacks: extra Lightning callbacks, a dict of `_target_` entries (open node)
    callbacks: Any = field(default_factory=dict)
