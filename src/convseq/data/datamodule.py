"""`TranslationDataModule`: data-bin preparation, datasets, token-budget batches, data loaders.

Run it under `Trainer(use_distributed_sampler=False, callbacks=[BatchEpochCallback(), ...])`
(`convseq.training.callbacks.BatchEpochCallback`): the batch sampler shards the batches over DDP
ranks itself (Lightning's sampler injection would break fairseq's "sort, pack, then shuffle
batches" order), and Lightning never calls a batch sampler's own `set_epoch`, so the callback does
(and counts the batches trained on, so that a checkpoint taken mid-epoch resumes at the next
batch; the train loader's state, saved by Lightning, is its sampler's `state_dict`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_info
from torch.utils.data import DataLoader

from convseq.common.config import plain, typed
from convseq.common.distributed import rank_and_world
from convseq.data.base_databin import BaseDataBin
from convseq.data.batching import TokenBatchSampler, match_max_sentences
from convseq.data.config import BatchingConfig, DataConfig
from convseq.data.databin import DataBin
from convseq.data.dataset import LanguagePairDataset
from convseq.data.fairseq_databin import fairseq_record
from convseq.data.preprocess import as_data_config, open_databin, prepare_databin
from convseq.data.vocab import with_absolute_dict_paths
from convseq.errors import DataError

SPLITS = ("train", "valid", "test")
# Set (True) on the Trainer callback that sets the train batch sampler's epoch and counts its
# batches (convseq.training.callbacks.BatchEpochCallback); without one the data module warns.
DRIVES_BATCH_SAMPLER = "drives_batch_sampler"


def batching_config(batching: Mapping | BatchingConfig) -> BatchingConfig:
    """`batching` as a checked BatchingConfig (an instance as it is; a mapping typed first:
    unknown keys and wrong types are refused)."""
    cfg = typed(BatchingConfig, batching, "batching", DataError)
    if cfg.max_tokens is None and cfg.max_sentences is None and cfg.match_max_tokens is None:
        raise DataError(
            "batching: max_tokens, max_sentences and match_max_tokens are all null; set one"
        )
    return cfg


class ResumableDataLoader(DataLoader):
    """A DataLoader whose position is its batch sampler's; Lightning saves it in checkpoints."""

    def state_dict(self) -> dict:
        return self.batch_sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.batch_sampler.load_state_dict(state)


class TranslationDataModule(pl.LightningDataModule):
    """Parallel corpus -> data-bin -> LanguagePairDatasets -> sharded token-budget batches.

    Args:
        data: the `data` config group as plain values (see `DataConfig`).
        batching: the `batching` config group as plain values (see `BatchingConfig`).
        cache_dir: root of the shared data-bin cache.
        seed: seed of the batch order (fairseq's --seed).
        max_source_positions, max_target_positions: longest pair kept (EOS included); train
            pairs beyond are filtered and counted, valid/test ones refused unless
            `data.eval_overlong=skip`.
        predict_split: the split `predict_dataloader` serves.
        databin: the data-bin of `data`, when the caller has prepared it already (as
            `convseq.tasks.train` does): the data module then prepares nothing itself.

    After `setup()`: `databin`, `src_dict`, `tgt_dict`; `batch_sampler(split)` and
    `num_filtered[split]` once a split's loader was made.
    """

    def __init__(
        self,
        data: DataConfig | Mapping,
        batching: BatchingConfig | Mapping,
        cache_dir: str,
        seed: int = 1,
        max_source_positions: int = 1022,
        max_target_positions: int = 1022,
        predict_split: str = "test",
        databin: BaseDataBin | None = None,
    ):
        super().__init__()
        # checked now: a typo fails before any work
        self.data_cfg = with_absolute_dict_paths(as_data_config(data))  # from any folder
        if self.data_cfg.format == "fairseq":  # and a fairseq data-bin's folder and pair
            self.data_cfg = fairseq_record(self.data_cfg, databin)
        self.batching = batching_config(batching)
        # the hyperparameters (what a checkpoint records) are plain values
        data, batching = plain(self.data_cfg), plain(self.batching)
        self.save_hyperparameters(ignore=["databin"])
        if predict_split not in SPLITS:
            raise DataError(f"predict_split must be one of {SPLITS}, got {predict_split!r}")
        self.cache_dir = str(cache_dir)
        self.seed = int(seed)
        self.max_positions = (int(max_source_positions), int(max_target_positions))
        self.predict_split = predict_split
        self.databin: BaseDataBin | None = None
        self.src_dict = None
        self.tgt_dict = None
        self.num_filtered: dict[str, int] = {}
        self._databin_path = None
        self._datasets: dict[str, LanguagePairDataset] = {}
        self._samplers: dict[tuple[str, int, int], TokenBatchSampler] = {}
        self._max_sentences: int | None = None
        if databin is not None:
            self._use(databin)

    # -- Lightning's data hooks -----------------------------------------------------------------
    def prepare_data(self) -> None:
        """Build (or find) the data-bin, once; Lightning runs this on one process per node, before
        each of fit, validate, test and predict."""
        if self.databin is None and self._databin_path is None:
            self._databin_path = prepare_databin(self.data_cfg, self.cache_dir, progress=True)

    def setup(self, stage: str | None = None) -> None:
        """Load the data-bin (every process); datasets and batches are made when first asked."""
        if self.databin is not None:
            return
        path = self._databin_path
        if path is None or self.data_cfg.format == "fairseq":
            # Another process prepared it; prepare_databin is file-locked and idempotent, so
            # here it only finds the finished data-bin (a fairseq one is read where it is).
            self._use(open_databin(self.data_cfg, self.cache_dir, progress=False))
        else:
            self._use(DataBin(path))

    def _use(self, databin: BaseDataBin) -> None:
        self.databin = databin
        self.src_dict, self.tgt_dict = databin.src_dict, databin.tgt_dict

    def train_dataloader(self) -> DataLoader:
        sampler = self.batch_sampler("train")
        trainer = self._trainer_or_none()
        if trainer is not None:
            # The first epoch's iterator is made (and its first batches fetched) right after this
            # call, before on_train_epoch_start: on a resumed run the loader must already know
            # the epoch it serves. Lightning's own sampler epoch is `epoch_progress.current
            # .processed` (the epoch being run), which current_epoch only catches up with later.
            progress = getattr(getattr(trainer, "fit_loop", None), "epoch_progress", None)
            epoch = progress.current.processed if progress is not None else trainer.current_epoch
            sampler.set_epoch(epoch)
            if not any(getattr(cb, DRIVES_BATCH_SAMPLER, False) for cb in trainer.callbacks):
                warnings.warn(
                    "TranslationDataModule: no BatchEpochCallback among the Trainer's callbacks: "
                    "the batch order will not change between epochs and a mid-epoch checkpoint "
                    "will not resume at the right batch; add convseq.training.callbacks."
                    "BatchEpochCallback()",
                    stacklevel=2,
                )
        return self._loader("train", sampler, ResumableDataLoader)

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid", self.batch_sampler("valid"))

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.batch_sampler("test"))

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.predict_split, self.batch_sampler(self.predict_split))

    # -- pieces ---------------------------------------------------------------------------------
    def dataset(self, split: str) -> LanguagePairDataset:
        """The LanguagePairDataset of `split` (train, valid or test)."""
        if self.databin is None:
            raise RuntimeError("call setup() before asking for datasets or loaders")
        if split not in self._datasets:
            src, tgt = self.databin.split(split)
            self._datasets[split] = LanguagePairDataset(
                src, tgt, pad=self.tgt_dict.pad(), eos=self.tgt_dict.eos()
            )
        return self._datasets[split]

    @property
    def max_sentences(self) -> int | None:
        """Train `max_sentences`: as configured, or derived from `match_max_tokens`."""
        b = self.batching
        if b.match_max_tokens is None:
            return b.max_sentences
        if self._max_sentences is None:
            train = self.dataset("train")
            self._max_sentences = match_max_sentences(
                train.src_sizes,
                train.tgt_sizes,
                b.match_max_tokens,
                self.max_positions,
                b.required_batch_size_multiple,
                self.seed,
                self.order,
            )
            rank_zero_info(
                f"batching: max_sentences={self._max_sentences} matches the mean batch size of "
                f"max_tokens={b.match_max_tokens} on the training set"
            )
        return self._max_sentences

    @property
    def order(self) -> str:
        """Length order of the batches: `batching.order` ("fairseq" or "snake")."""
        return self.batching.order

    def batch_sampler(self, split: str) -> TokenBatchSampler:
        """The (cached) batch sampler of `split` for this process's rank and world size."""
        rank, world = self.rank_and_world()
        key = (split, rank, world)
        if key not in self._samplers:
            b, ds, train = self.batching, self.dataset(split), split == "train"
            max_tokens = b.max_tokens if train or b.max_tokens_valid is None else b.max_tokens_valid
            max_sent = self.max_sentences
            if not train and b.max_sentences_valid is not None:
                max_sent = b.max_sentences_valid
            sampler = TokenBatchSampler(
                ds.src_sizes,
                ds.tgt_sizes,
                max_tokens=max_tokens,
                max_sentences=max_sent,
                required_batch_size_multiple=b.required_batch_size_multiple,
                max_positions=self.max_positions,
                shuffle=train and b.shuffle,
                seed=self.seed,
                rank=rank,
                world_size=world,
                overlong="skip" if train else self.data_cfg.eval_overlong,
                name=split,
                order=self.order,
                source=self.databin.describe_split(split),
            )
            self.num_filtered[split] = sampler.num_filtered
            if sampler.num_filtered:
                rank_zero_info(
                    f"{split}: {sampler.num_filtered} pair(s) longer than max_positions "
                    f"{self.max_positions} filtered out, {sampler.num_kept} kept"
                )
            self._samplers[key] = sampler
        return self._samplers[key]

    def rank_and_world(self) -> tuple[int, int]:
        """(rank, world size): from the attached Trainer, else torch.distributed, else (0, 1)."""
        return rank_and_world(self._trainer_or_none())

    def _trainer_or_none(self) -> pl.Trainer | None:
        return getattr(self, "trainer", None)

    def _loader(self, split: str, sampler: TokenBatchSampler, cls: type = DataLoader) -> DataLoader:
        workers = self.data_cfg.num_workers
        trainer = self._trainer_or_none()
        on_cuda = trainer is not None and trainer.strategy.root_device.type == "cuda"
        return cls(
            self.dataset(split),
            batch_sampler=sampler,
            collate_fn=self.dataset(split).collater,
            num_workers=workers,
            pin_memory=on_cuda,  # page-locked batches copy to the GPU asynchronously
            # Keeping train workers alive saves their start-up each epoch; the batch sampler
            # runs in the main process, so set_epoch still reaches it.
            persistent_workers=workers > 0 and split == "train",
        )


__all__ = [
    "DRIVES_BATCH_SAMPLER",
    "ResumableDataLoader",
    "TranslationDataModule",
    "batching_config",
]
