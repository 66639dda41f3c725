"""The structured-config schema behind conf/: unknown keys and wrong types fail at composition.

`register_configs()` stores the root schema in Hydra's ConfigStore as `config_schema`;
conf/config.yaml extends it explicitly in its defaults list, so every group option (a YAML file
under conf/<group>/) is merged onto a typed node and checked by Hydra itself. It also stores each
optimiser's defaults (`convseq.optim.config.OPTIMIZER_DEFAULTS`) as `optim/defaults/<name>`, which
conf/optim/<name>.yaml starts from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from convseq.data.config import BatchingConfig, DataConfig
from convseq.models.config import FConvConfig
from convseq.optim.config import OPTIMIZER_DEFAULTS, OptimConfig

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


@dataclass
class PathsConfig:
    """Where data is read and artefacts are written (all resolved to absolute paths)."""

    data_root: str = MISSING  # parent of corpus folders ($CONVSEQ_DATA_ROOT, else ./data)
    cache_dir: str = MISSING  # generated corpora and data-bins ($CONVSEQ_CACHE, else user cache)
    output_dir: str = MISSING  # this run's own folder (Hydra's output dir)


@dataclass
class AnnealConfig:
    """The learning-rate annealing strategy (conf/anneal)."""

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


@dataclass
class CriterionConfig:
    """The training loss (label-smoothed cross entropy; epsilon 0 = plain cross entropy)."""

    label_smoothing: float = 0.0
    normalize: str = "tokens"  # tokens | sentences: what gradients are divided by


@dataclass
class TrainerConfig:
    """Arguments passed to pytorch_lightning.Trainer (a subset; see conf/trainer)."""

    accelerator: str = "cpu"  # cpu | gpu | auto
    devices: Any = 1  # number of devices or a list of ids
    num_nodes: int = 1
    strategy: str = "auto"  # auto | ddp | ddp_spawn
    precision: str = "32-true"  # 32-true | bf16-mixed | 16-mixed
    max_epochs: int = 100  # fairseq's --max-epoch
    max_time: str | None = None  # "DD:HH:MM:SS": stop after this wall time
    accumulate_grad_batches: int = 1  # fairseq's --update-freq
    check_val_every_n_epoch: int = 1
    log_every_n_steps: int = 50
    # an int is a number of batches, a float a fraction (Lightning's meaning): typed Any so that
    # limit_val_batches=2 stays 2 batches instead of becoming 2.0
    limit_train_batches: Any = None
    limit_val_batches: Any = None
    num_sanity_val_steps: int = 0
    fast_dev_run: bool = False
    enable_progress_bar: bool = True  # false: no bar (progress=auto still writes lines off a TTY)
    deterministic: bool = False
    # convseq's own (not Trainer arguments): how progress shows, auto | bar | lines | json | none
    # (auto: the bar on a terminal, a line every log_every_n_steps updates otherwise)
    progress: str = "auto"
    # torch threads per process; None: the CPUs this process may use / the processes sharing
    # them (convseq.common.threads); OMP_NUM_THREADS set before the start also wins over the rule
    threads: int | None = None
    # CUDA GPUs of compute capability >= 8.0: fp32 products in TF32 (convseq.common.tf32);
    # false: full fp32 arithmetic. Nothing changes on a CPU or an older GPU.
    tf32: bool = True


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
class GenConfig:
    """Generation: task=generate / interactive, and BLEU during training (fairseq-generate's flags)."""

    beam: int = 5
    lenpen: float = 1.0  # scores divided by length ** lenpen
    unk_penalty: float = 0.0  # subtracted from the unknown word's log-prob
    min_len: int = 1  # EOS forbidden before this many tokens
    max_len_a: float = 0.0  # EOS forced after int(max_len_a * src_len + max_len_b) tokens
    max_len_b: int = 200
    nbest: int = 1  # hypotheses per sentence in the n-best file (and interactive output)
    normalize_scores: bool = True  # false: fairseq's --unnormalized (plain log-prob sums)
    need_attn: bool = True  # attention alignments in the n-best file (false: a little faster)
    precision: str = "fp32"  # fp32 | bf16 | int8: task=generate/interactive (docs/generation.md)
    max_tokens: int | None = 4000  # source tokens per batch, padding included
    batch_size: int | None = None  # sentences per batch (with or instead of max_tokens)
    split: str = "test"  # valid | test: the split task=generate translates and scores
    input: str | None = None  # task=generate: a raw text file to translate instead of a split
    reference: str | None = None  # task=generate with input: its reference file (BLEU, chrF)
    tokenize: str = "13a"  # sacreBLEU's tokenizer
    profile: bool = False  # task=generate: print where the time goes (+ a bar chart PNG)
    plot_attention: int = 0  # task=generate: attention heatmap PNGs of the first N sentences
    output: str | None = None  # folder of the generate files (default: the run folder)
    dict_dir: str | None = None  # fairseq checkpoints: folder of dict.<lang>.txt (default: beside)
    test_bleu: bool = True  # task=train: translate the test split with the best checkpoint


@dataclass
class CompareConfig:
    """`task=compare`: paired bootstrap resampling between systems' translations (convseq.tasks.compare)."""

    runs: list[str] = field(default_factory=list)  # run folders or hypothesis files, baseline first
    split: str = "test"  # run folders: their generate-<split>.txt
    refs: str | None = None  # reference file (default: the split's text in the data-bin of `data`)
    n_samples: int = 1000  # bootstrap resamples
    seed: int = 12345  # resampling seed (>= 1)


@dataclass
class Config:
    """The root of every composed configuration."""

    task: str = "train"  # one of TASKS
    seed: int = 1  # fairseq's --seed: model init, batch order (seed + epoch)
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    model: FConvConfig = field(default_factory=FConvConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    anneal: AnnealConfig = field(default_factory=AnnealConfig)
    criterion: CriterionConfig = field(default_factory=CriterionConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    amp: AmpConfig = field(default_factory=AmpConfig)
    ckpt: str | None = None  # a checkpoint to load (generate)
    resume: Any = False  # false | true (continue paths.output_dir) | auto (continue it if it can) | a run folder or checkpoint
    max_update: int = 0  # stop after this many updates (0 = no limit; fairseq's --max-update)
    patience: int = -1  # stop after N validations without improvement (-1 = off)
    optimized_metric: str = "valid/loss"  # what train() returns to sweepers (its best value)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    sweep_dir: str | None = None  # task=report: the multirun folder to summarise
    report: ReportConfig = field(default_factory=ReportConfig)
    ckpts: list[str] = field(default_factory=list)  # task=average: checkpoints (or a run folder)
    average: AverageConfig = field(default_factory=AverageConfig)
    import_fairseq: ImportFairseqConfig = field(default_factory=ImportFairseqConfig)
    gen: GenConfig = field(default_factory=GenConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    # task=train: validation BLEU every N epochs (0 = off; None: off, or every epoch when the
    # checkpoint or the sweep goes by valid/bleu)
    bleu_every_n_epochs: int | None = None
    validate_interval_updates: int = 0  # validate every N updates instead of every epoch (0 = off)
    save_interval_updates: int = 0  # checkpoints/updateUUUUUUU.ckpt every N updates (0 = off)
    profile: bool = False  # task=train: print where each training epoch's time goes
    final_test: bool = True  # task=train: test loss (and gen.test_bleu) of best.ckpt at the end
    # conf/logger: the experiment tracker(s), one `_target_` entry or a dict of them (open node)
    logger: Any = None
    # conf/callbacks: extra Lightning callbacks, a dict of `_target_` entries (open node)
    callbacks: Any = field(default_factory=dict)


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
