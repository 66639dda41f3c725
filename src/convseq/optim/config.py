"""The `optim` and `anneal` config groups: their schemas and each optimiser's defaults.

`OptimConfig` types the `optim` group, `AnnealConfig` the `anneal` group (a run's config holds
one of each: `convseq.training.config.TrainConfig`). `OPTIMIZER_DEFAULTS` gives each optimiser's
settings: conf/optim/<name>.yaml starts from them (`convseq.cli.schema.register_configs` stores
them in Hydra's ConfigStore as `optim/defaults/<name>`); a Python caller takes
``OPTIMIZER_DEFAULTS["adam"]`` (or `dataclasses.replace` of it) for Adam's.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OptimConfig:
    """The optimiser (conf/optim): NAG as fairseq defines it, plain SGD, or Adam."""

    name: str = "nag"  # nag | sgd | adam
    lr: float = 0.25  # fairseq's --lr (one default for every optimiser in fairseq)
    momentum: float = 0.99  # nag, sgd
    weight_decay: float = 0.0
    clip_norm: float = 0.1  # clip the gradient norm after token normalisation (0 = off)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # adam
    eps: float = 1e-8  # adam


OPTIMIZER_DEFAULTS: dict[str, OptimConfig] = {
    # fairseq's NAG: Nesterov momentum with the lr correction lr/lr_old; weight decay decoupled,
    # scaled by lr (fairseq's recipe: OptimConfig's own defaults)
    "nag": OptimConfig(name="nag"),
    # plain SGD, momentum 0 as the Lua toolkit's sgd
    "sgd": OptimConfig(name="sgd", momentum=0.0),
    # Adam (torch's AdamW: decoupled weight decay, as fairseq's adam), no clipping
    "adam": OptimConfig(name="adam", lr=0.001, clip_norm=0.0),
}
OPTIMIZERS = tuple(OPTIMIZER_DEFAULTS)


@dataclass
class AnnealConfig:
    """The learning-rate annealing strategy (conf/anneal; `convseq.optim.anneal`)."""

    name: str = "plateau"  # plateau | force | lua | none | inverse_sqrt | cosine
    lr_shrink: float = 0.1  # lr *= lr_shrink at each annealing step
    lr_threshold: float = 1e-4  # plateau: relative improvement that counts as better
    lr_patience: int = 0  # plateau: bad validations tolerated before shrinking
    force_anneal: int | None = None  # force: first annealed epoch (1-based)
    min_epoch_to_anneal: int = 0  # lua: never shrink before this epoch
    min_lr: float = 1e-5  # stop training once lr falls below this (cosine: the lr it ends at)
    warmup_updates: int = 0  # inverse_sqrt, cosine: updates of linear warm-up
    warmup_init_lr: float = 0.0  # inverse_sqrt, cosine: the lr the warm-up starts from
    total_updates: int = 0  # cosine: its length in updates, where training stops (0: max_update)
