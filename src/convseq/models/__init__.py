"""The fconv model: configuration, layer specifications, encoder, decoder and the model."""

from convseq.models.config import FConvConfig, ModelConfigError, as_fconv_config
from convseq.models.decoder import FConvDecoder
from convseq.models.encoder import FConvEncoder
from convseq.models.fconv import FConvModel
from convseq.models.spec import SpecError, parse_attention, parse_layers

__all__ = [
    "FConvConfig",
    "FConvDecoder",
    "FConvEncoder",
    "FConvModel",
    "ModelConfigError",
    "SpecError",
    "as_fconv_config",
    "parse_attention",
    "parse_layers",
]
