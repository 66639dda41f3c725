"""The fconv model's configuration schema (the `model` group of conf/)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class FConvConfig:
    """fairseq's fconv arguments, with fairseq's names and its base-architecture defaults."""

    arch: str = "fconv"  # preset name, for display and checkpoints
    dropout: float = 0.1
    encoder_embed_dim: int = 512
    encoder_layers: Any = (
        "[(512, 3)] * 20"  # list of [channels, kernel(, residual)] or fairseq's string
    )
    decoder_embed_dim: int = 512
    decoder_layers: Any = "[(512, 3)] * 20"
    decoder_out_embed_dim: int = 256
    decoder_attention: Any = True  # a bool for every layer, or one bool per layer
    share_input_output_embed: bool = False
    max_source_positions: int = 1024  # rows of the positional table (usable: 1024 - pad - 1 = 1022)
    max_target_positions: int = 1024
