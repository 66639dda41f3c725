"""`task=import_fairseq`: turn a fairseq translation checkpoint (fconv or LightConv / DynamicConv)
into a convseq (Lightning) checkpoint.

    python run.py task=import_fairseq ckpt=/models/wmt14.en-fr/model.pt \
        import_fairseq.output=/models/en-fr.ckpt [import_fairseq.dict_dir=...]

The fairseq file is read through `convseq.checkpoints.fairseq.load_fairseq` (weights_only loading with an
explicit allowlist; nothing in it runs). The result loads with
``ConvSeqModule.load_from_checkpoint(path)`` under torch's default ``weights_only=True``: its
hyperparameters are plain values and the dictionaries travel inside it as symbol lists.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from convseq.checkpoints.fairseq import load_fairseq
from convseq.checkpoints.io import atomic_torch_save
from convseq.errors import CheckpointError
from convseq.optim.config import OptimConfig
from convseq.tasks.config import ImportFairseqTaskConfig
from convseq.training.config import CriterionConfig
from convseq.training.module import ConvSeqModule

__all__ = ["import_fairseq", "run_import_fairseq"]


def import_fairseq(
    checkpoint_path: str | os.PathLike,
    output_path: str | os.PathLike,
    dict_dir: str | os.PathLike | None = None,
    optim: OptimConfig | Mapping[str, Any] | None = None,
    criterion: CriterionConfig | Mapping[str, Any] | None = None,
) -> Path:
    """Convert a fairseq fconv or LightConv checkpoint; return the written convseq checkpoint's
    path.

    Args:
        checkpoint_path: fairseq's checkpoint (``checkpoint_best.pt``, ``model.pt``).
        output_path: where the convseq checkpoint is written (atomically).
        dict_dir: folder of ``dict.<lang>.txt``; default: beside the checkpoint.
        optim, criterion: settings stored for fine-tuning from the converted model.
    """
    model, src_dict, tgt_dict = load_fairseq(checkpoint_path, dict_dir)
    if model.cfg is None:  # pragma: no cover - load_fairseq always builds from a config
        raise CheckpointError(f"{checkpoint_path}: the imported model carries no configuration")
    model_cfg = dataclasses.asdict(model.cfg)
    module = ConvSeqModule(
        model=model_cfg,
        src_vocab=src_dict.to_list(),
        tgt_vocab=tgt_dict.to_list(),
        optim=optim,
        criterion=criterion,
    )
    module.model.load_state_dict(model.state_dict(), strict=True)
    checkpoint = {
        "epoch": 0,
        "global_step": 0,
        "pytorch-lightning_version": pl.__version__,
        "state_dict": module.state_dict(),
        "hyper_parameters": dict(module.hparams),
        "imported_from": str(Path(checkpoint_path).resolve()),
    }
    output = Path(output_path)
    output.parent.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(checkpoint, output)
    return output


def run_import_fairseq(cfg: ImportFairseqTaskConfig) -> Path:
    """Convert the fairseq checkpoint `ckpt` to a convseq checkpoint."""
    if not cfg.ckpt:
        raise CheckpointError(
            "task=import_fairseq needs ckpt=PATH: a fairseq fconv or LightConv checkpoint"
        )
    opts = cfg.import_fairseq
    output = opts.output or str(Path(cfg.paths.output_dir) / "imported.ckpt")
    path = import_fairseq(cfg.ckpt, output, opts.dict_dir, optim=cfg.optim, criterion=cfg.criterion)
    print(f"convseq checkpoint written: {path}")
    return path
