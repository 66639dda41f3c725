"""TranslationDataModule under a real pytorch_lightning.Trainer on CPU: epochs, resume, predict."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from omegaconf import OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint

from convseq.data.batching import match_max_sentences
from convseq.data.datamodule import TranslationDataModule
from convseq.errors import DataError
from convseq.training.callbacks import BatchEpochCallback
from tests.conftest import compose_config

TOKENS = {"max_tokens": 120, "required_batch_size_multiple": 1, "max_tokens_valid": 200}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """A small random parallel corpus and a cache holding its data-bin (built once)."""
    root = tmp_path_factory.mktemp("tiny")
    rng = np.random.RandomState(0)
    words = [f"w{i}" for i in range(40)]
    sizes = {"train": 300, "valid": 40, "test": 37}
    for split, n in sizes.items():
        for lang in ("xx", "yy"):
            lines = [" ".join(rng.choice(words, rng.randint(1, 15))) for _ in range(n)]
            (root / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = {"name": "tiny", "dir": str(root), "src_lang": "xx", "tgt_lang": "yy"}
    cache = root / "cache"
    dm = TranslationDataModule(data, TOKENS, str(cache))
    dm.prepare_data()
    return {"data": data, "cache": str(cache), "sizes": sizes}


def make_dm(tiny, batching=None, **kw) -> TranslationDataModule:
    return TranslationDataModule(tiny["data"], batching or TOKENS, tiny["cache"], **kw)


class Recorder(pl.LightningModule):
    """Records the sentence ids of each training batch and returns ids when predicting."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, tuple[int, ...]]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, tuple(sorted(batch["id"].tolist()))))
        return self.w.sum() * batch["net_input"]["src_tokens"].float().mean()

    def predict_step(self, batch, batch_idx):
        return {"id": batch["id"], "is_dummy": batch["is_dummy"]}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def trainer(tmp_path, callbacks=None, **kw) -> pl.Trainer:
    args = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 3,
        "use_distributed_sampler": False,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
        "default_root_dir": str(tmp_path),
    }
    args.update(kw)
    cbs = [BatchEpochCallback()] if callbacks is None else callbacks
    return pl.Trainer(callbacks=cbs, **args)


def expected_epoch(dm: TranslationDataModule, epoch: int) -> list[tuple[int, ...]]:
    return [tuple(sorted(b.tolist())) for b, _ in dm.batch_sampler("train").rank_batches(epoch)]


def test_setup_exposes_databin_and_dictionaries(tiny):
    dm = make_dm(tiny)
    dm.setup("fit")
    assert dm.databin is not None and len(dm.src_dict) > 40 and len(dm.tgt_dict) > 40
    assert len(dm.dataset("train")) == tiny["sizes"]["train"]
    batch = next(iter(dm.val_dataloader()))
    src = batch["net_input"]["src_tokens"]
    assert (src[:, -1] == dm.src_dict.eos()).all()  # left padding: EOS in the last column
    assert (batch["net_input"]["prev_output_tokens"][:, 0] == dm.tgt_dict.eos()).all()


def test_a_data_module_given_its_data_bin_prepares_nothing(tiny, tmp_path, monkeypatch):
    prepared = make_dm(tiny)
    prepared.setup("fit")
    databin = prepared.databin
    assert databin.text_processing() == {
        "src_lang": "xx",
        "tgt_lang": "yy",
        "src_spm": None,
        "tgt_spm": None,
    }

    def fail(*args, **kwargs):
        raise AssertionError("the data-bin was prepared again")

    monkeypatch.setattr("convseq.data.datamodule.prepare_databin", fail)
    dm = make_dm(tiny, databin=databin)
    assert dm.databin is databin and dm.src_dict is databin.src_dict
    assert "databin" not in dm.hparams  # hyperparameters stay plain values
    trainer(tmp_path, max_epochs=1).fit(Recorder(), datamodule=dm)  # prepare_data, setup: no-ops
    assert dm.databin is databin


def test_set_epoch_reaches_the_sampler_under_a_real_trainer(tiny, tmp_path):
    runs = []
    for _ in range(2):
        dm, model = make_dm(tiny, seed=3), Recorder()
        trainer(tmp_path).fit(model, datamodule=dm)
        runs.append(model.seen)
    seen = runs[0]
    per_epoch = [[ids for e, ids in seen if e == epoch] for epoch in range(3)]
    assert per_epoch[0] != per_epoch[1] and per_epoch[1] != per_epoch[2]
    assert sorted(per_epoch[0]) == sorted(per_epoch[1])  # same frozen batches, new order
    for epoch in range(3):
        assert per_epoch[epoch] == expected_epoch(dm, epoch)
    assert runs[0] == runs[1]  # same seed -> same batches in the same order
    other, model = make_dm(tiny, seed=4), Recorder()
    trainer(tmp_path, max_epochs=1).fit(model, datamodule=other)
    assert [ids for _, ids in model.seen] != per_epoch[0]


def test_without_the_callback_the_order_repeats_and_a_warning_says_so(tiny, tmp_path):
    dm, model = make_dm(tiny, seed=3), Recorder()
    with pytest.warns(UserWarning, match="no BatchEpochCallback"):
        trainer(tmp_path, callbacks=[], max_epochs=2).fit(model, datamodule=dm)
    first = [ids for e, ids in model.seen if e == 0]
    assert first == [ids for e, ids in model.seen if e == 1]


def test_mid_epoch_checkpoint_resumes_at_the_next_batch(tiny, tmp_path):
    dm, model = make_dm(tiny, seed=5), Recorder()
    dm.setup("fit")
    nb = len(dm.batch_sampler("train"))
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_last=True)
    stop_at = nb + 3  # three batches into the second epoch
    trainer(
        tmp_path,
        callbacks=[BatchEpochCallback(), ckpt],
        max_steps=stop_at,
        enable_checkpointing=True,
    ).fit(model, datamodule=dm)
    assert len(model.seen) == stop_at

    dm2, model2 = make_dm(tiny, seed=5), Recorder()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*not resumable.*")
        trainer(tmp_path, callbacks=[BatchEpochCallback()], max_epochs=3).fit(
            model2, datamodule=dm2, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt")
        )
    resumed = [ids for _, ids in model2.seen]
    assert resumed[: nb - 3] == expected_epoch(dm, 1)[3:]
    assert resumed[nb - 3 :] == expected_epoch(dm, 2)
    assert [e for e, _ in model2.seen] == [1] * (nb - 3) + [2] * nb


def test_end_of_epoch_checkpoint_resumes_with_the_next_epochs_order(tiny, tmp_path):
    # With worker processes the first epoch's batches are requested before on_train_epoch_start,
    # so the loader itself must already know the resumed epoch.
    data = {**tiny["data"], "num_workers": 1}
    dm, model = TranslationDataModule(data, TOKENS, tiny["cache"], seed=6), Recorder()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer(
        tmp_path, callbacks=[BatchEpochCallback(), ckpt], max_epochs=1, enable_checkpointing=True
    ).fit(model, datamodule=dm)
    dm2, model2 = TranslationDataModule(data, TOKENS, tiny["cache"], seed=6), Recorder()
    trainer(tmp_path, max_epochs=2).fit(
        model2, datamodule=dm2, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt")
    )
    assert {e for e, _ in model2.seen} == {1}
    assert [ids for _, ids in model2.seen] == expected_epoch(dm, 1)


def test_predict_path_works_and_returns_every_test_sentence_once(tiny, tmp_path):
    dm, model = make_dm(tiny), Recorder()
    out = trainer(tmp_path).predict(model, datamodule=dm)
    assert all(not o["is_dummy"] for o in out)
    ids = sorted(i for o in out for i in o["id"].tolist())
    assert ids == list(range(tiny["sizes"]["test"]))
    assert len(out) == len(dm.batch_sampler("test"))


def test_rank_and_world_come_from_the_attached_trainer(tiny):
    dm = make_dm(tiny)
    dm.setup("fit")
    assert dm.rank_and_world() == (0, 1)
    n = len(dm.batch_sampler("train").batches)
    dm.trainer = SimpleNamespace(
        global_rank=2,
        world_size=3,
        current_epoch=0,
        callbacks=[BatchEpochCallback()],
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
    )
    sampler = dm.batch_sampler("train")
    assert (sampler.rank, sampler.world_size) == (2, 3)
    assert len(sampler) == -(-n // 3)
    loader = dm.train_dataloader()
    assert loader.batch_sampler is sampler and len(loader) == len(sampler)


def test_matched_fixed_sentence_batching(tiny):
    batching = {
        "name": "sentences",
        "max_tokens": None,
        "max_sentences": 64,
        "match_max_tokens": 150,
        "required_batch_size_multiple": 1,
    }
    dm = make_dm(tiny, batching=batching)
    dm.setup("fit")
    train = dm.dataset("train")
    want = match_max_sentences(train.src_sizes, train.tgt_sizes, 150)
    assert dm.max_sentences == want != 64
    sampler = dm.batch_sampler("train")
    assert max(len(b) for b in sampler.batches) == want
    assert sampler.max_tokens is None


def test_over_long_pairs_are_filtered_in_train_and_refused_in_valid(tiny):
    dm = make_dm(tiny, max_source_positions=10, max_target_positions=12)
    dm.setup("fit")
    src, tgt = dm.dataset("train").src_sizes, dm.dataset("train").tgt_sizes
    n_long = int(((src > 10) | (tgt > 12)).sum())
    assert n_long > 0
    dm.train_dataloader()
    assert dm.num_filtered["train"] == n_long
    with pytest.raises(DataError, match="valid: .* longer than max_positions"):
        dm.val_dataloader()
    skipping = {**tiny["data"], "eval_overlong": "skip"}
    dm2 = TranslationDataModule(
        skipping, TOKENS, tiny["cache"], max_source_positions=10, max_target_positions=12
    )
    dm2.prepare_data()
    dm2.setup("validate")
    dm2.val_dataloader()
    assert dm2.num_filtered["valid"] > 0


def test_worker_processes_deliver_the_same_batches(tiny):
    data = {**tiny["data"], "num_workers": 2}
    dm0 = make_dm(tiny)
    dm2 = TranslationDataModule(data, TOKENS, tiny["cache"])
    for d in (dm0, dm2):
        d.prepare_data()
        d.setup("fit")
    a = [b["id"].tolist() for b in dm0.val_dataloader()]
    b = [b["id"].tolist() for b in dm2.val_dataloader()]
    assert a == b and len(a) > 1


def test_bad_batching_config_is_refused(tiny):
    with pytest.raises(DataError, match="max_tokenz"):
        make_dm(tiny, batching={"max_tokenz": 100})
    with pytest.raises(DataError, match="all null"):
        make_dm(tiny, batching={"max_tokens": None, "max_sentences": None})


def test_default_toy_corpus_through_the_composed_config(cache_dir, tmp_path):
    # The real conf/ tree and the embedded corpus, as run.py would hand them over.
    cfg = compose_config(["data=toy", "batching=tokens"], output_dir=str(tmp_path))
    plain = OmegaConf.to_container(cfg, resolve=True)
    dm = TranslationDataModule(plain["data"], cfg.batching, plain["paths"]["cache_dir"], seed=1)
    assert plain["paths"]["cache_dir"] == str(cache_dir)
    assert type(dm.hparams["batching"]) is dict  # never an OmegaConf object (P8)
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.dataset("train")) == 20_000
    sampler = dm.batch_sampler("train")
    assert sampler.num_filtered == 0
    batch = next(iter(dm.train_dataloader()))
    assert batch["net_input"]["src_tokens"].numel() <= 4000
    row = batch["net_input"]["src_tokens"][0]
    text = dm.databin.decode(row.tolist(), side="src")
    i = int(batch["id"][0])
    assert text == dm.databin.decode(dm.dataset("train")[i]["source"].tolist(), side="src")
    assert len(text.split()) == int(batch["net_input"]["src_lengths"][0]) - 1
