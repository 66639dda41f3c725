"""Plain Python values from OmegaConf objects: configs are resolved once, then passed as dicts.

Hyperparameters, checkpoints and the models' settings must never hold OmegaConf containers (a
checkpoint with one would not load with ``weights_only=True``), so every layer that accepts a
DictConfig turns it into plain dicts and lists here.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


def to_plain(value: Any) -> Any:
    """Plain dicts and lists (every interpolation resolved) from a DictConfig or ListConfig;
    any other value as it is.

    Raises:
        omegaconf.errors.MissingMandatoryValue: a value is still missing (``???``).
    """
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True, throw_on_missing=True)
    return value
