"""The `optim` config group: its schema and each optimiser's defaults, in one place.

`OptimConfig` types the group (the root schema, `convseq.cli.schema.Config`, holds one).
`OPTIMIZER_DEFAULTS` gives each optimiser's settings: conf/optim/<name>.yaml starts from them
(`convseq.cli.schema.register_configs` stores them in Hydra's ConfigStore as
`optim/defaults/<name>`), and `build_optimizer` falls back on them for a key it is not given.
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
