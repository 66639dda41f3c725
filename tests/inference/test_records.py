"""Translation records: their content, and the host reads it takes to build them.

`Translator.translate_batch` turns the search's hypotheses (device tensors) into records holding
CPU tensors and Python values. Each device-to-host copy makes the host wait for a GPU's queue, so
the records of a batch are built from one copy per kind of tensor, whatever the number of
hypotheses. On the CPU that is observed by giving the records' builder tensors of `OnDevice`, a
tensor type standing for device memory: reading one on the host is counted, and ``.cpu()`` gives
a plain (host) tensor.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

import convseq.inference.translator as translator_module
from convseq.data.dictionary import Dictionary
from convseq.inference.options import GenConfig
from convseq.inference.translator import Translator
from convseq.models.fconv import FConvModel
from convseq.search import beam_search

SMALL = dict(
    encoder_embed_dim=16,
    encoder_layers="[(24, 3)] * 2",
    decoder_embed_dim=16,
    decoder_layers="[(24, 3), (24, 2)]",
    decoder_out_embed_dim=16,
    dropout=0.1,
)
LENGTHS = [4, 9, 6, 12, 2]


def dictionary(size: int, prefix: str) -> Dictionary:
    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"{prefix}{i}")
    return d


@pytest.fixture(scope="module")
def translator() -> Translator:
    src_dict, tgt_dict = dictionary(30, "s"), dictionary(40, "t")
    torch.manual_seed(0)
    model = FConvModel.build(SMALL, len(src_dict), len(tgt_dict)).eval()
    return Translator([model], src_dict, tgt_dict)


def a_batch(lengths: list[int] = LENGTHS, seed: int = 3) -> dict[str, Any]:
    """A collated batch as `translate_batch` takes it: left-padded sources, ids out of order."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    src = torch.full((len(lengths), width), 1)
    for i, n in enumerate(lengths):
        src[i, width - n :] = torch.randint(4, 30, (n,), generator=g)
        src[i, -1] = 2
    ids = torch.arange(len(lengths)).flip(0) * 10
    return {"id": ids, "net_input": {"src_tokens": src, "src_lengths": torch.tensor(lengths)}}


# ---------------------------------------------------------------- content


@pytest.mark.parametrize("need_attn", [True, False])
def test_records_hold_the_search_hypotheses_as_host_values(translator, need_attn):
    options = GenConfig(beam=4, nbest=3, max_len_b=7, need_attn=need_attn)
    batch = a_batch()
    records = translator.translate_batch(batch, options)
    net = batch["net_input"]
    hyps = beam_search(
        translator.models[0], net["src_tokens"], net["src_lengths"], **options.search_kwargs()
    )
    assert [r["id"] for r in records] == batch["id"].tolist()
    for record, nbest, n, row in zip(records, hyps, LENGTHS, net["src_tokens"], strict=True):
        assert record["src_symbols"] == [translator.src_dict[t] for t in row[-n:].tolist()]
        assert len(record["hypotheses"]) == len(nbest) == 3
        for got, h in zip(record["hypotheses"], nbest, strict=True):
            tokens = h["tokens"].tolist()
            assert got["tokens"].dtype == torch.long and got["tokens"].tolist() == tokens
            assert got["symbols"] == [translator.tgt_dict[t] for t in tokens]
            assert got["text"] == translator.decode(tokens)
            assert type(got["score"]) is float and got["score"] == h["score"]
            assert got["positional_scores"].dtype == torch.float32
            assert torch.equal(got["positional_scores"], h["positional_scores"])
            if need_attn:
                assert got["attention"].dtype == torch.float32
                assert torch.equal(got["attention"], h["attention"])
                assert got["alignment"] == h["attention"].argmax(0).tolist()
            else:
                assert got["attention"] is None and got["alignment"] == []
            for key in ("tokens", "positional_scores", "attention"):
                t = got[key]
                if t is None:
                    continue
                assert t.device.type == "cpu" and type(t) is torch.Tensor
                # its own memory: a record pickled alone carries its own values only
                assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
    one = pickle.dumps(records[0]["hypotheses"][0]["positional_scores"])
    assert len(one) < 2000


# ---------------------------------------------------------------- host reads


_READS = {
    torch.Tensor.cpu,
    torch.Tensor.tolist,
    torch.Tensor.item,
    torch.Tensor.numpy,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
    torch.Tensor.__bool__,
    torch.Tensor.__array__,
    torch.equal,
}


class OnDevice(torch.Tensor):
    """A tensor standing for device memory: it says it is on a CUDA device, host reads are
    counted, and ``.cpu()`` gives a plain (host) tensor, which the host may read freely.
    Operations on it give `OnDevice` tensors; its values stay in host memory."""

    reads: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func == torch.Tensor.device.__get__:
            return torch.device("cuda", 0)
        if func in _READS:
            cls.reads.append(func.__name__)
            if func is torch.Tensor.cpu:
                with torch._C.DisableTorchFunctionSubclass():
                    return args[0].as_subclass(torch.Tensor)
        return super().__torch_function__(func, types, args, kwargs or {})


def on_device(value: Any) -> Any:
    return value.as_subclass(OnDevice) if isinstance(value, torch.Tensor) else value


def reads_of_a_batch(monkeypatch, translator, options, tensor_scores=False) -> list[str]:
    """The host reads of `translate_batch` outside the search, with the search's outputs and the
    batch's tensors on the (simulated) device."""

    def search_on_device(model, src_tokens, src_lengths, **kwargs):
        plain = [t.as_subclass(torch.Tensor) for t in (src_tokens, src_lengths)]
        hyps = beam_search(model, *plain, **kwargs)
        for nbest in hyps:
            for h in nbest:
                for key in ("tokens", "positional_scores", "attention"):
                    h[key] = on_device(h[key])
                if tensor_scores:
                    h["score"] = OnDevice(torch.tensor(h["score"], dtype=torch.float64))
        return hyps

    monkeypatch.setattr(translator_module, "beam_search", search_on_device)
    batch = a_batch()
    batch["id"] = on_device(batch["id"])
    batch["net_input"] = {k: on_device(v) for k, v in batch["net_input"].items()}
    OnDevice.reads = []
    records = translator.translate_batch(batch, options)
    assert sum(len(r["hypotheses"]) for r in records) == len(LENGTHS) * options.nbest
    for r in records:
        assert type(r["id"]) is int
        for h in r["hypotheses"]:
            assert type(h["score"]) is float
            assert all(type(h[k]) is torch.Tensor for k in ("tokens", "positional_scores"))
    return OnDevice.reads


def test_a_batch_of_records_copies_once_per_kind_of_tensor(monkeypatch, translator):
    one = reads_of_a_batch(monkeypatch, translator, GenConfig(beam=5, nbest=1, max_len_b=6))
    five = reads_of_a_batch(monkeypatch, translator, GenConfig(beam=5, nbest=5, max_len_b=6))
    # the integers (ids, sources, output tokens) and the floats (scores, attention)
    assert one == five == ["cpu", "cpu"]
    scores = reads_of_a_batch(
        monkeypatch, translator, GenConfig(beam=5, nbest=5, max_len_b=6), tensor_scores=True
    )
    assert scores == ["cpu"] * 3  # tensor scores in their own dtype: one more copy


def test_tensor_scores_become_the_same_python_floats(monkeypatch, translator):
    options = GenConfig(beam=3, nbest=2, max_len_b=5)
    plain = translator.translate_batch(a_batch(), options)
    scored = []

    def search_with_tensor_scores(model, src_tokens, src_lengths, **kwargs):
        hyps = beam_search(model, src_tokens, src_lengths, **kwargs)
        for nbest in hyps:
            for h in nbest:
                h["score"] = torch.tensor(h["score"], dtype=torch.float32)
                scored.append(float(h["score"]))
        return hyps

    monkeypatch.setattr(translator_module, "beam_search", search_with_tensor_scores)
    got = translator.translate_batch(a_batch(), options)
    assert [h["score"] for r in got for h in r["hypotheses"]] == scored
    assert [h["text"] for r in got for h in r["hypotheses"]] == [
        h["text"] for r in plain for h in r["hypotheses"]
    ]
