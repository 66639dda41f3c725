"""convseq: convolutional sequence-to-sequence translation (fairseq's fconv and LightConv /
DynamicConv) on Lightning + Hydra.

The names most programs need, importable from the package itself::

    from convseq import ConvSeqModule, GenConfig, Translator

    module = ConvSeqModule.load_from_checkpoint("outputs/run/checkpoints/best.ckpt")
    Translator.from_checkpoints("outputs/run").translate("ein Hund läuft .", beam=5)
    Translator.from_checkpoints("outputs/run", options=GenConfig(beam=5, nbest=2))

Each is imported on first use (`import convseq` alone loads neither torch nor Lightning), from
the layer that owns it; docs/overview.md maps the folders.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC = {
    "ConvSeqModule": "convseq.training.module",
    "TranslationDataModule": "convseq.data.datamodule",
    "FConvModel": "convseq.models.fconv",
    "LightConvModel": "convseq.models.lightconv",
    "build_model": "convseq.models.family",
    "Translator": "convseq.inference.translator",
    "beam_search": "convseq.search.beam",
    "load_fairseq": "convseq.checkpoints.fairseq",
    "save_fairseq": "convseq.checkpoints.fairseq",
    "GenConfig": "convseq.inference.options",
    "TrainConfig": "convseq.training.config",
}

__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access (PEP 562) and cache the name here."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'convseq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
