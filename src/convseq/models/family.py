"""The model families convseq builds, and the one place that tells them apart.

A family is a typed config class and a model class with a ``build(cfg, src_vocab_size,
tgt_vocab_size, padding_idx)`` classmethod; every config names its family in its ``family`` key
(``fconv`` where a checkpoint from before the key existed has none). Training, search,
checkpoints and export call `model_config` and `build_model` and never look at the name
themselves. A new family is one more `ModelFamily` in `FAMILIES` (CONTRIBUTING.md, "Add a model").
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from omegaconf import DictConfig, OmegaConf
from torch import nn

from convseq.common.config import typed
from convseq.models.config import FConvConfig, ModelConfigError
from convseq.models.fconv import FConvModel
from convseq.models.lightconv import LightConvModel
from convseq.models.lightconv_config import LightConvConfig

__all__ = [
    "FAMILIES",
    "MODEL_KEYS",
    "ModelConfig",
    "ModelFamily",
    "build_model",
    "config_class",
    "family_of",
    "model_config",
    "preset_config",
]

ModelConfig: TypeAlias = FConvConfig | LightConvConfig  # the config of any family


class BuildsModel(Protocol):
    """A model class: ``build`` makes a freshly initialised model from its family's config."""

    @classmethod
    def build(
        cls, cfg: Any, src_vocab_size: int, tgt_vocab_size: int, padding_idx: int
    ) -> nn.Module: ...


@dataclass(frozen=True)
class ModelFamily:
    """A family's config schema and model class."""

    name: str  # the `family` key's value
    config: type  # the typed config (a dataclass with a `family` and an `arch` field)
    model: type[BuildsModel]  # the model class (encoder, incremental decoder, build)


FAMILIES: dict[str, ModelFamily] = {
    f.name: f
    for f in (
        ModelFamily("fconv", FConvConfig, FConvModel),
        ModelFamily("lightconv", LightConvConfig, LightConvModel),
    )
}
DEFAULT_FAMILY = FConvConfig.family  # what a config without the key (an older checkpoint's) is


def family_of(value: Any) -> ModelFamily:
    """The family a model config names: a family's dataclass, or a DictConfig or mapping of
    its keys (a checkpoint's hyperparameters: those from before the key are fconv's).

    Raises:
        ModelConfigError: an unknown family, with the known ones and the closest.
    """
    if isinstance(value, (Mapping, DictConfig)):
        name = value["family"] if "family" in value else DEFAULT_FAMILY
    else:
        name = getattr(value, "family", DEFAULT_FAMILY)
    if name not in FAMILIES:
        close = difflib.get_close_matches(str(name), list(FAMILIES), 1, 0.5)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ModelConfigError(
            f"model.family={name!r}{hint}: the families are {', '.join(FAMILIES)}; a preset "
            "(model=NAME, conf/model/) sets it"
        )
    return FAMILIES[name]


def config_class(value: Any) -> type:
    """The config dataclass of the family `value` names (`family_of`)."""
    return family_of(value).config


# metadata of a config field that holds a model config: its keys are those of the family its
# value names (`convseq.common.config.typed` types it so, `convseq.cli.config_check` checks them)
MODEL_KEYS = {"schema_of": config_class, "schemas": tuple(f.config for f in FAMILIES.values())}


def model_config(cfg: ModelConfig | DictConfig | Mapping[str, Any] | None) -> ModelConfig:
    """`cfg` as its family's typed config: an instance as it is, a DictConfig or a mapping (a
    checkpoint's hyperparameters, a Python caller's dict) merged onto the family's defaults.

    Raises:
        ModelConfigError: an unknown family, an unknown key (with the family's keys) or a
            value of the wrong type.
    """
    if cfg is None:
        return FConvConfig()
    schema = config_class(cfg)
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, schema):
        raise ModelConfigError(f"model: a {type(cfg).__name__} names family {cfg.family!r}")
    return typed(schema, cfg, "model", ModelConfigError)


def preset_config(path: str | os.PathLike) -> ModelConfig:
    """A preset file of conf/model read without Hydra (benchmarks, scripts): its keys typed by
    the family it names. Its defaults list, which points Hydra at that family's schema, is
    Hydra's alone and is left out."""
    node = OmegaConf.load(path)
    return model_config({k: v for k, v in node.items() if k != "defaults"})


def build_model(
    cfg: ModelConfig | DictConfig | Mapping[str, Any],
    src_vocab_size: int,
    tgt_vocab_size: int,
    padding_idx: int,
) -> nn.Module:
    """A freshly initialised model of the family `cfg` names, over the dictionaries' sizes."""
    cfg = model_config(cfg)
    return family_of(cfg).model.build(cfg, src_vocab_size, tgt_vocab_size, padding_idx)
