"""Generation over a data-bin split or encoded text: the checkpoints, the batches, the wrapper.

`task=generate` (`convseq.tasks.generate`) and validation BLEU during training
(`convseq.training.bleu`) both translate a split through these pieces:

- `checkpoint_paths` / `load_translator`: ``ckpt=`` (one path, or several joined by ':' for an
  ensemble) read into a `Translator` with the ``gen`` search settings (which data it may
  translate: `convseq.inference.data_match`);
- `split_loader`: the split's sources batched by ``gen.max_tokens`` / ``gen.batch_size``;
  `batch_loader`: the same for any dataset of encoded sources (``task=generate gen.input=FILE``);
- `split_batches` / `encoded_batches`: what a rank's loader is built from, once the ranks are
  known (a `BatchesFn`);
- `GenerationModule` + `predict_trainer`: a Translator run by ``trainer.predict`` (device
  placement, progress bar, the generation profiler's hooks);
- `translate_split`: the same without a Trainer, for use inside training hooks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader

from convseq.common.config import DeviceConfig
from convseq.common.distributed import rank_and_world
from convseq.data.batching import source_batches
from convseq.data.databin import DataBin
from convseq.data.dataset import LanguagePairDataset
from convseq.errors import CheckpointError, DataError
from convseq.inference.data_match import check_databin
from convseq.inference.options import GenConfig
from convseq.inference.precision import device_type
from convseq.inference.profiler import GenerationProfiler
from convseq.inference.records import best_texts, in_input_order
from convseq.inference.sharding import BatchList, gather_objects, shard
from convseq.inference.translator import Translator

log = logging.getLogger(__name__)


def checkpoint_paths(ckpt: str | Sequence[str] | None, task: str = "generate") -> list[str]:
    """The checkpoints of ``ckpt``: one path, or several joined by ':' (an ensemble); ``task``
    names the task that needs them when there is none."""
    if not ckpt:
        raise CheckpointError(
            f"task={task} needs ckpt=PATH (a .ckpt, a run folder, or a fairseq checkpoint_*.pt; "
            "several joined by ':' for an ensemble)"
        )
    parts = [ckpt] if isinstance(ckpt, str) else list(ckpt)
    paths = [p for part in parts for p in str(part).split(":") if p]
    if not paths:
        raise CheckpointError(f"ckpt={ckpt!r} names no checkpoint")
    return paths


def load_translator(
    ckpt: str | Sequence[str] | None,
    gen: GenConfig,
    accelerator: str = "cpu",
    databin: DataBin | None = None,
) -> Translator:
    """The Translator of ``ckpt`` (`checkpoint_paths`) with ``gen``'s search settings, in
    ``gen.precision`` on the device ``accelerator`` (``trainer.accelerator``) names.

    A checkpoint without its own segmentation (a fairseq one, or an older convseq one) whose
    dictionaries are the data-bin's gets the data-bin's segmentation (`adopt_segmentation`).
    """
    translator = Translator.from_checkpoints(
        checkpoint_paths(ckpt), dict_dir=gen.dict_dir, options=gen
    )
    if databin is not None:
        adopt_segmentation(translator, databin)
    if gen.precision != "fp32":
        # checked against where task=generate / interactive will run
        translator.with_precision(gen.precision, device_type(accelerator))
    return translator


def adopt_segmentation(translator: Translator, databin: DataBin) -> None:
    """Give a translator without a segmentation of its own (a fairseq checkpoint, an older
    convseq one) the data-bin's, when their dictionaries are the same."""
    if (
        translator.src_segmenter.model is None
        and translator.src_dict == databin.src_dict
        and translator.tgt_dict == databin.tgt_dict
    ):
        translator.src_segmenter = databin.segmenter("src")
        translator.tgt_segmenter = databin.segmenter("tgt")


# ---------------------------------------------------------------------------- batches


#: ``shard_of=(rank, world)`` -> that rank's batches: Lightning starts the ranks after the
#: module exists, so the module holds this and builds its loader in ``predict_dataloader``.
BatchesFn = Callable[..., DataLoader]


@dataclass(frozen=True)
class SourceLines:
    """Where the sentences of an encoded dataset come from: a file and each one's 1-based line.

    Lets a batching error name the file and line of the sentence concerned.
    """

    path: str
    lines: Sequence[int]

    def __call__(self, index: int) -> tuple[str, int]:
        return self.path, int(self.lines[index])


def split_loader(
    translator: Translator,
    databin: DataBin,
    split: str,
    gen: GenConfig,
    shard_of: tuple[int, int] = (0, 1),
    pin_memory: bool = False,
) -> DataLoader:
    """Batches of the split's sources, by ``gen.max_tokens`` and/or ``gen.batch_size``.

    With the data-bin's own dictionaries the binarised split is used as it is; other models (a
    fairseq checkpoint, another data-bin's model) get the split's raw source text encoded with
    their own segmentation and dictionary. ``shard_of=(rank, world)`` keeps that rank's share
    of the one-process batch list (`convseq.inference.sharding`): the same batches, split up.
    """
    if translator.src_dict == databin.src_dict:
        src, _ = databin.split(split)
        dataset = LanguagePairDataset(src, None, pad=translator.src_dict.pad())
    else:
        lines = databin.text(split, "src")
        encoded, _ = translator.encode_lines(lines, lambda cut: f"{split}: {len(cut)} line(s)")
        dataset = LanguagePairDataset(encoded, None, pad=translator.src_dict.pad())
    return batch_loader(dataset, translator, gen, split, shard_of, pin_memory=pin_memory)


def batch_loader(
    dataset: LanguagePairDataset,
    translator: Translator,
    gen: GenConfig,
    name: str,
    shard_of: tuple[int, int] = (0, 1),
    locate: Callable[[int], tuple[str, int]] | None = None,
    pin_memory: bool = False,
) -> DataLoader:
    """Batches of ``dataset``'s sources, made as a split's are (length-sorted, token budget).

    ``name`` is the data's name in messages; ``locate(i)`` gives (file, line) of sentence ``i``
    for them, when the sentences come from a text file. ``pin_memory``: page-locked batches,
    which copy to a GPU without blocking the host.
    """
    max_tokens, batch_size = gen.max_tokens, gen.batch_size
    if max_tokens is None and batch_size is None:
        raise DataError("gen.max_tokens and gen.batch_size are both null; set one")
    limit = translator.max_source_positions() or 1 << 30
    longest_at = int(np.argmax(dataset.src_sizes))
    longest = int(dataset.src_sizes[longest_at])
    if max_tokens is not None and longest > int(max_tokens):
        fix = f"raise gen.max_tokens to at least {longest}"
        if locate is None:
            raise DataError(
                f"gen.max_tokens={max_tokens} is smaller than the longest source of {name} "
                f"({longest} tokens, EOS included): {fix}"
            )
        path, line = locate(longest_at)
        raise DataError(
            f"this line is {longest} tokens long (EOS included), more than gen.max_tokens="
            f"{max_tokens}: {fix}",
            path=path,
            line=line,
        )
    batches = source_batches(
        dataset.src_sizes,
        None if max_tokens is None else int(max_tokens),
        None if batch_size is None else int(batch_size),
        limit,
        name,
    )
    batches = BatchList(shard(batches, *shard_of))  # one process' batches, every world-th
    return DataLoader(
        dataset, batch_sampler=batches, collate_fn=dataset.collater, pin_memory=pin_memory
    )


def split_batches(
    translator: Translator, databin: DataBin, split: str, gen: GenConfig
) -> BatchesFn:
    """A `BatchesFn` of the split (`split_loader` with the rank's ``shard_of``)."""
    return partial(split_loader, translator, databin, split, gen)


def encoded_batches(
    translator: Translator,
    encoded: Sequence[np.ndarray],
    gen: GenConfig,
    name: str,
    locate: Callable[[int], tuple[str, int]] | None = None,
) -> BatchesFn:
    """A `BatchesFn` of already encoded sources (ids ending in EOS); sentence ids index them."""
    if not encoded:
        raise DataError(f"{name}: no sentence to translate")
    dataset = LanguagePairDataset(list(encoded), None, pad=translator.src_dict.pad())
    return partial(batch_loader, dataset, translator, gen, name, locate=locate)


class GenerationModule(pl.LightningModule):
    """A Translator as a LightningModule, for ``trainer.predict`` on one device or several.

    Each rank translates its share of the batches (``batches`` called with its rank) and keeps
    its records; at the end of the predict epoch every rank holds all records, in input order
    (`records`), gathered while the process group is still up.

    Args:
        translator: the models (one, or an ensemble), dictionaries and segmentation.
        options: the search settings.
        batches: what `predict_dataloader` returns, given ``shard_of=(rank, world)``: a split's
            (`split_batches`) or encoded text's (`encoded_batches`).
        profiler: optional `GenerationProfiler` (its timer is passed to the search); it times
            this rank's share only.
    """

    def __init__(
        self,
        translator: Translator,
        options: GenConfig,
        batches: BatchesFn,
        profiler: GenerationProfiler | None = None,
    ):
        super().__init__()
        self.translator = translator
        self.members = nn.ModuleList(translator.models)  # registered: Lightning moves them
        self.options = options
        self.batches = batches
        self.profiler_ = profiler
        self.records: list[dict] = []
        self.sentences_per_rank: list[int] = []
        self._mine: list[dict] = []

    def predict_dataloader(self) -> DataLoader:
        # built here, once the ranks are known (Lightning starts them after the module exists)
        # Lightning has moved the module by now: pinned batches when it is on a GPU
        return self.batches(
            shard_of=(self.global_rank, self.trainer.world_size),
            pin_memory=self.device.type == "cuda",
        )

    def on_predict_epoch_start(self) -> None:
        self._mine, self.records = [], []

    def predict_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> int:
        """Translate one batch into this rank's records; returns how many sentences it held.

        The records are kept here (gathered at the epoch's end), not returned; the count is
        returned because Lightning warns ("predict returned None ...") on every step that
        returns nothing, which would tell a convseq user nothing.
        """
        before = len(self._mine)
        if self.profiler_ is None:
            self._mine.extend(self.translator.translate_batch(batch, self.options))
        else:
            with self.profiler_.step():
                self._mine.extend(
                    self.translator.translate_batch(batch, self.options, self.profiler_.timer)
                )
        return len(self._mine) - before

    def on_predict_epoch_end(self) -> None:
        shares = gather_objects(self._mine)  # per rank, its records
        self.sentences_per_rank = [len(s) for s in shares]
        self.records = in_input_order(shares)
        self._mine = []

    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.profiler_ is not None:
            self.profiler_.batch_start()

    def on_predict_batch_end(
        self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.profiler_ is not None:
            self.profiler_.batch_end()


def predict_trainer(
    trainer: DeviceConfig, progress: bool = False, callbacks: Sequence[pl.Callback] = ()
) -> pl.Trainer:
    """A Trainer for trainer.predict (no logger, no checkpoints) on ``trainer.devices`` devices.

    With several devices (``trainer.strategy=ddp``, or ``trainer=ddp``) each rank translates its
    share of the split; `GenerationModule` gathers the records. ``trainer.precision`` is not
    used: generation runs in ``gen.precision``.
    """
    return pl.Trainer(
        accelerator=trainer.accelerator,
        devices=trainer.devices,
        num_nodes=trainer.num_nodes,
        strategy=trainer.strategy,
        # gen.precision alone decides the arithmetic (the model copy is cast to it), so that
        # the results file records what ran; trainer.precision is training's setting
        precision="32-true",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress,
        use_distributed_sampler=False,  # batch_loader shards the batches itself
        callbacks=list(callbacks),
    )


def translate_split(
    translator: Translator,
    databin: DataBin,
    split: str,
    gen: GenConfig,
) -> list[str]:
    """The best translation of every sentence of ``split``, in input order, on every rank.

    No Trainer: usable inside training hooks. In a distributed run each rank translates its
    share of the batches (on the device its models are on) and the texts are gathered; the
    result is the one-process result on every rank. A translator loaded from checkpoints that
    record their training data refuses a data-bin of other data (`check_databin`).
    """
    check_databin(translator.trained_on, databin, (translator.src_dict, translator.tgt_dict), True)
    loader = split_loader(translator, databin, split, gen, rank_and_world())
    mine = []
    with torch.inference_mode():
        for batch in loader:
            for r in translator.translate_batch(batch, gen):
                mine.append({"id": r["id"], "hypotheses": [{"text": r["hypotheses"][0]["text"]}]})
    records = in_input_order(gather_objects(mine))  # only ids and texts cross processes
    return best_texts(records, len(databin.text(split, "tgt")))
