"""Typed configs: the `paths` group's schema, and `typed`, which makes a config dataclass of a
plain mapping where one comes from outside (a Python caller's dict, a checkpoint's
hyperparameters).

Every config group has one schema, a dataclass in the layer that uses it (`optim.config`,
`training.config`, `inference.options`, `data.config`, `models.config`); each default is
written there once. The command line hands the tasks these dataclasses (`OmegaConf.to_object`
of the composed config); the library reads their attributes and never restates a default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from convseq.errors import SettingError

T = TypeVar("T")

__all__ = ["DeviceConfig", "PathsConfig", "TrainerConfig", "plain", "typed"]


@dataclass
class PathsConfig:
    """Where data is read and artefacts are written (all resolved to absolute paths)."""

    data_root: str = MISSING  # parent of corpus folders ($CONVSEQ_DATA_ROOT, else ./data)
    cache_dir: str = MISSING  # generated corpora and data-bins ($CONVSEQ_CACHE, else user cache)
    output_dir: str = MISSING  # this run's own folder (Hydra's output dir)


@dataclass
class DeviceConfig:
    """Where a task runs: the devices, the processes and the threads (the `trainer` node of the
    tasks that translate; `TrainerConfig` adds what training reads)."""

    accelerator: str = "cpu"  # cpu | gpu | auto
    devices: Any = 1  # number of devices or a list of ids
    num_nodes: int = 1
    strategy: str = "auto"  # auto | ddp | ddp_spawn
    # torch threads per process; None: the CPUs this process may use / the processes sharing
    # them (convseq.common.threads); OMP_NUM_THREADS set before the start also wins over the rule
    threads: int | None = None
    # CUDA GPUs of compute capability >= 8.0: fp32 products in TF32 (convseq.common.tf32);
    # false: full fp32 arithmetic. Nothing changes on a CPU or an older GPU.
    tf32: bool = True


@dataclass
class TrainerConfig(DeviceConfig):
    """Arguments passed to pytorch_lightning.Trainer (a subset; see conf/trainer) and the
    devices and threads (`DeviceConfig`).

    Here rather than in training/ because generation (`convseq.inference.generation`'s
    predict Trainer) and the thread rule (`convseq.common.threads`) read its devices too.
    """

    precision: str = "32-true"  # 32-true | bf16-mixed | 16-mixed
    max_epochs: int = 100  # fairseq's --max-epoch (0 = no limit)
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
    # convseq's own (not a Trainer argument): how progress shows, auto | bar | lines | json |
    # none (auto: the bar on a terminal, a line every log_every_n_steps updates otherwise)
    progress: str = "auto"
    # convseq's own: the job log (progress lines|json) also writes a line this many seconds after
    # its last one, for slow updates; 0: lines by update count only
    progress_seconds: float = 30.0


def typed(
    schema: type[T],
    value: T | Mapping[str, Any] | DictConfig | None,
    where: str = "",
    error: type[Exception] = SettingError,
) -> T:
    """`value` as an instance of the dataclass `schema`.

    An instance is returned as it is (no copy); a mapping or DictConfig is merged onto the
    schema's defaults and checked: an unknown key or a value of the wrong type raises `error`
    naming the key (under the prefix `where`, e.g. ``"model"``), with the known keys.

    A field whose metadata has ``schema_of`` (a function of the field's value that returns a
    dataclass: `convseq.models.family.MODEL_KEYS`) is typed by the schema its value names.
    """
    if isinstance(value, schema):
        return value
    try:
        if isinstance(value, DictConfig) and OmegaConf.get_type(value) is schema:
            return OmegaConf.to_object(value)  # type: ignore[return-value]  # composed on it
        node = OmegaConf.structured(schema)
        held: dict[str, Any] = {}
        if value is not None:
            if not isinstance(value, (Mapping, DictConfig)):
                raise error(
                    f"{where or schema.__name__}: expected a {schema.__name__} or a mapping of "
                    f"its keys, got {type(value).__name__}"
                )
            value, held = _hold_open_fields(schema, value)
            node = OmegaConf.merge(node, value)
        result = OmegaConf.to_object(node)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        name = f"{where}.{key}" if where and key else (key or where or schema.__name__)
        detail = str(e).splitlines()[0]
        if isinstance(e, ConfigKeyError):
            # the keys of the node that lacks it (a nested group's, e.g. config.optim's)
            node = getattr(e, "object_type", None)
            if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
                node = schema
            known = sorted(f.name for f in dataclasses.fields(node))  # type: ignore[arg-type]
            parent = ".".join(p for p in (where, key.rpartition(".")[0]) if p)
            detail += f"; the keys of {parent or node.__name__} are {known}"
        raise error(f"{name}: {detail}") from e
    for name, held_value in held.items():  # each typed by the schema its value names
        kind = _field(schema, name).metadata["schema_of"](held_value)
        prefix = f"{where}.{name}" if where else name
        setattr(result, name, typed(kind, held_value, prefix, error))
    return result  # type: ignore[return-value]


def _field(schema: type, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(schema) if f.name == name)


def _hold_open_fields(
    schema: type, value: Mapping[str, Any] | DictConfig
) -> tuple[Mapping[str, Any] | DictConfig, dict[str, Any]]:
    """`value` without the fields `schema` types by their value (``schema_of``), and those."""
    names = {f.name for f in dataclasses.fields(schema) if "schema_of" in f.metadata}
    if not names.intersection(value.keys()):
        return value, {}
    if isinstance(value, DictConfig):  # its parts apart: interpolations resolved first
        value = OmegaConf.to_container(value, resolve=True)  # type: ignore[assignment]
    held = {k: value[k] for k in names if k in value}
    rest = {k: v for k, v in value.items() if k not in names}
    return rest, held


def plain(value: Any) -> Any:
    """A config dataclass (nested ones too), DictConfig or ListConfig as plain dicts and lists,
    every interpolation resolved; anything else as it is.

    What a checkpoint keeps of a config: plain values load with ``weights_only=True``.

    Raises:
        omegaconf.errors.MissingMandatoryValue: a value is still missing (``???``).
    """
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True, throw_on_missing=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
