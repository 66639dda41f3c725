"""LanguagePairDataset and its collate: fairseq's padding and decoder-input conventions."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from convseq.data.batching import TokenBatchSampler, dummy_index
from convseq.data.dataset import LanguagePairDataset, collate
from convseq.data.indexed import TokenArray, write_split
from convseq.errors import DataError

# pad = 1, eos = 2
SRC = [[5, 6, 2], [7, 2], [2], [8, 9, 10, 11, 2]]
TGT = [[20, 2], [21, 22, 23, 2], [24, 2], [25, 2]]


def make(src=SRC, tgt=TGT) -> LanguagePairDataset:
    to_arrays = lambda xs: [np.array(x) for x in xs]  # noqa: E731
    return LanguagePairDataset(to_arrays(src), None if tgt is None else to_arrays(tgt))


def test_collate_conventions_literal():
    ds = make()
    batch = ds.collater([ds[0], ds[1], ds[2]])
    # rows by decreasing source length; ids say where each row came from
    assert batch["id"].tolist() == [0, 1, 2]
    assert torch.equal(
        batch["net_input"]["src_tokens"],
        torch.tensor([[5, 6, 2], [1, 7, 2], [1, 1, 2]]),  # LEFT-padded, EOS last
    )
    assert batch["net_input"]["src_lengths"].tolist() == [3, 2, 1]
    assert torch.equal(
        batch["target"],
        torch.tensor([[20, 2, 1, 1], [21, 22, 23, 2], [24, 2, 1, 1]]),  # right-padded
    )
    assert torch.equal(
        batch["net_input"]["prev_output_tokens"],
        torch.tensor([[2, 20, 1, 1], [2, 21, 22, 23], [2, 24, 1, 1]]),  # EOS, then target[:-1]
    )
    assert batch["ntokens"] == 2 + 4 + 2
    assert batch["nsentences"] == 3
    assert batch["is_dummy"] is False
    assert batch["id"].dtype == torch.int64 and batch["target"].dtype == torch.int64


def test_collate_sorts_rows_by_decreasing_source_length():
    ds = make()
    batch = ds.collater([ds[2], ds[1], ds[3]])
    assert batch["id"].tolist() == [3, 1, 2]
    assert torch.equal(
        batch["net_input"]["src_tokens"],
        torch.tensor([[8, 9, 10, 11, 2], [1, 1, 1, 7, 2], [1, 1, 1, 1, 2]]),
    )
    assert torch.equal(
        batch["target"], torch.tensor([[25, 2, 1, 1], [21, 22, 23, 2], [24, 2, 1, 1]])
    )
    assert torch.equal(
        batch["net_input"]["prev_output_tokens"],
        torch.tensor([[2, 25, 1, 1], [2, 21, 22, 23], [2, 24, 1, 1]]),
    )


def test_dummy_batch_reuses_sentences_with_zero_weight():
    ds = make()
    batch = ds.collater([ds[dummy_index(1)], ds[dummy_index(0)]])
    assert batch["is_dummy"] is True
    assert batch["nsentences"] == 0 and batch["ntokens"] == 0
    assert batch["id"].tolist() == [0, 1]  # the real sentences, so shapes are realistic
    assert batch["net_input"]["src_tokens"].shape == (2, 3)


def test_a_batch_never_mixes_dummy_and_real_samples():
    ds = make()
    with pytest.raises(ValueError, match="mixes dummy and real"):
        ds.collater([ds[0], ds[dummy_index(1)]])


def test_source_only_dataset_has_no_target():
    ds = make(tgt=None)
    batch = ds.collater([ds[0], ds[1]])
    assert batch["target"] is None and batch["net_input"]["prev_output_tokens"] is None
    assert batch["ntokens"] == 0
    assert torch.equal(batch["net_input"]["src_tokens"], torch.tensor([[5, 6, 2], [1, 7, 2]]))


def test_sentence_without_eos_is_refused():
    ds = make(tgt=[[20, 2], [21, 22, 23], [24, 2], [25, 2]])
    with pytest.raises(DataError, match="target sentence 1 .* does not end with EOS"):
        ds.collater([ds[0], ds[1]])


def test_lengths_must_agree():
    with pytest.raises(DataError, match="source has 4 sentences but target has 3"):
        make(tgt=TGT[:3])


def test_index_out_of_range():
    ds = make()
    with pytest.raises(IndexError):
        ds[4]
    with pytest.raises(IndexError):
        ds[dummy_index(4)]


def test_token_arrays_pickle_as_paths(tmp_path):
    # DataLoader workers started with spawn receive the dataset pickled: the memory maps must
    # travel as file names, not as copies of the corpus.
    rng = np.random.RandomState(0)
    sents = [np.append(rng.randint(4, 50, size=rng.randint(0, 30)), 2) for _ in range(3000)]
    write_split(tmp_path / "train.src", sents, 64)
    write_split(tmp_path / "train.tgt", sents[::-1], 64)
    ds = LanguagePairDataset(TokenArray(tmp_path / "train.src"), TokenArray(tmp_path / "train.tgt"))
    blob = pickle.dumps(ds)
    token_bytes = sum(len(s) for s in sents) * 2  # uint16 ids on disk
    assert len(blob) < 0.05 * token_bytes
    back = pickle.loads(blob)
    assert isinstance(back.src, TokenArray)
    assert np.array_equal(back.src_sizes, ds.src_sizes)
    assert np.array_equal(back.tgt_sizes, ds.tgt_sizes)
    assert back[17]["source"].tolist() == sents[17].tolist()
    assert back[17]["target"].tolist() == sents[-18].tolist()


def test_loader_round_trip_restores_every_sentence():
    rng = np.random.RandomState(1)
    src = [np.append(rng.randint(4, 30, size=rng.randint(0, 12)), 2) for _ in range(150)]
    tgt = [np.append(rng.randint(4, 30, size=rng.randint(0, 12)), 2) for _ in range(150)]
    ds = LanguagePairDataset(src, tgt)
    sampler = TokenBatchSampler(ds.src_sizes, ds.tgt_sizes, max_tokens=64)
    seen = set()
    for batch in DataLoader(ds, batch_sampler=sampler, collate_fn=collate):
        s = batch["net_input"]["src_tokens"]
        t = batch["target"]
        assert s.numel() <= 64 and t.shape[0] * max(s.shape[1], t.shape[1]) <= 64
        for row, i in enumerate(batch["id"].tolist()):
            seen.add(i)
            assert s[row][s[row] != 1].tolist() == src[i].tolist()
            assert t[row][t[row] != 1].tolist() == tgt[i].tolist()
        assert batch["ntokens"] == int((t != 1).sum())
    assert seen == set(range(150))


def batches_equal(a: dict, b: dict) -> bool:
    keys = ("id", "target")
    inner = ("src_tokens", "src_lengths", "prev_output_tokens")
    return (
        all(torch.equal(a[k], b[k]) for k in keys)
        and all(torch.equal(a["net_input"][k], b["net_input"][k]) for k in inner)
        and (a["ntokens"], a["nsentences"], a["is_dummy"])
        == (b["ntokens"], b["nsentences"], b["is_dummy"])
    )


@pytest.mark.parametrize("backing", ["token_array", "lists"])
def test_batch_fetch_equals_one_by_one_fetch(tmp_path, backing):
    rng = np.random.RandomState(2)
    src = [np.append(rng.randint(4, 60, size=rng.randint(0, 20)), 2) for _ in range(400)]
    tgt = [np.append(rng.randint(4, 60, size=rng.randint(0, 20)), 2) for _ in range(400)]
    if backing == "token_array":
        write_split(tmp_path / "s", src, 64)
        write_split(tmp_path / "t", tgt, 64)
        ds = LanguagePairDataset(TokenArray(tmp_path / "s"), TokenArray(tmp_path / "t"))
    else:
        ds = LanguagePairDataset(src, tgt)
    for idx in ([5, 399, 0, 17, 17, 230], [dummy_index(i) for i in (3, 9, 1)], [42]):
        fast = ds.collater(ds.__getitems__(idx))
        slow = ds.collater([ds[i] for i in idx])
        assert batches_equal(fast, slow)
    with pytest.raises(ValueError, match="mixes dummy and real"):
        ds.__getitems__([1, dummy_index(2)])
    with pytest.raises(IndexError):
        ds.__getitems__([400])
