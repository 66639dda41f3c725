"""The fconv model's configuration schema (the `model` group of conf/)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from convseq.common.config import typed
from convseq.errors import ConvseqError


@dataclass
class FConvConfig:
    """fairseq's fconv arguments, with fairseq's names and its base-architecture defaults.

    The layer specifications are typed ``Any`` because they may be fairseq's string form or a
    (YAML) list; `convseq.models.spec` reads both.
    """

    arch: str = "fconv"  # preset name, for display and checkpoints
    family: str = "fconv"  # the model family (`convseq.models.family`); set by the presets
    dropout: float = 0.1  # fairseq's --dropout (no preset sets it; the recipes pass 0.1-0.2)
    encoder_embed_dim: int = 512  # token and position embedding size of the encoder
    encoder_layers: Any = (
        "[(512, 3)] * 20"  # list of [channels, kernel(, residual)] or fairseq's string
    )
    decoder_embed_dim: int = 512  # token and position embedding size of the decoder
    decoder_layers: Any = "[(512, 3)] * 20"  # same forms as encoder_layers
    decoder_out_embed_dim: int = 256  # fc2's output size, fed to the vocabulary projection fc3
    decoder_attention: Any = True  # a bool for every layer, or one bool per layer
    share_input_output_embed: bool = False  # tie fc3 to the decoder embeddings (needs out = embed)
    max_source_positions: int = 1024  # rows of the positional table (usable: 1024 - pad - 1 = 1022)
    max_target_positions: int = 1024


class ModelConfigError(ConvseqError, ValueError):
    """The model configuration has an unknown key or a value of the wrong kind."""


def as_fconv_config(cfg: FConvConfig | DictConfig | Mapping[str, Any]) -> FConvConfig:
    """An FConvConfig from a dataclass (returned as it is), a DictConfig or a plain dict with its
    keys (a checkpoint's hyperparameters, a Python caller's dict).

    Missing keys take the base-architecture defaults; unknown keys are refused by name.
    """
    return typed(FConvConfig, cfg, "model", ModelConfigError)
