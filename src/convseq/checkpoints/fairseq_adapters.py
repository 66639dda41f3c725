"""Which `FairseqAdapter` reads or writes a model: by the fairseq architecture a checkpoint
names, or by the family a convseq config names. The one table of the families' fairseq forms;
a family with a fairseq counterpart adds its adapter to `ADAPTERS`.
"""

from __future__ import annotations

from typing import Any

from convseq.checkpoints.fairseq_args import FairseqAdapter
from convseq.checkpoints.fairseq_fconv import FCONV
from convseq.checkpoints.fairseq_lightconv import LIGHTCONV
from convseq.errors import CheckpointError
from convseq.models.family import family_of

ADAPTERS: dict[str, FairseqAdapter] = {a.family: a for a in (FCONV, LIGHTCONV)}
BY_ARCH: dict[str, FairseqAdapter] = {
    arch: adapter for adapter in ADAPTERS.values() for arch in adapter.archs
}


def adapter_for_arch(arch: str) -> FairseqAdapter:
    """The adapter of the family that registers fairseq architecture ``arch``."""
    if arch not in BY_ARCH:
        known = "; ".join(f"{a.family}: {', '.join(a.archs)}" for a in ADAPTERS.values())
        raise CheckpointError(
            f"architecture {arch!r} is not one of fairseq's translation architectures convseq "
            f"reads ({known}); not fconv_lm, fconv_self_att or language models"
        )
    return BY_ARCH[arch]


def adapter_for_config(cfg: Any) -> FairseqAdapter:
    """The adapter of the family a model config names (`convseq.models.family.family_of`)."""
    name = family_of(cfg).name
    if name not in ADAPTERS:
        raise CheckpointError(f"model family {name!r} has no fairseq checkpoint form")
    return ADAPTERS[name]
