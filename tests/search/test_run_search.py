"""What every search does around its loop (`run_search`): checks, empty batches, limits, modes."""

from __future__ import annotations

import pytest
import torch

from convseq.models.fconv import FConvModel
from convseq.search.run import SearchBatch, SearchSettings, max_lengths, run_search
from tests.search.test_search import SMALL, V_SRC, V_TGT, batch


def settings(**changes) -> SearchSettings:
    values = dict(
        beam=3, lenpen=1.0, unk_penalty=0.0, min_len=1, max_len_a=0.5, max_len_b=4, nbest=2,
        normalize_scores=True, fold_weight_norm=True, beamable_mm=True, need_attn=True,
    )  # fmt: skip
    values.update(changes)
    return SearchSettings(**values)


def test_run_search_hands_the_search_a_checked_batch_in_inference_and_generation_mode():
    model = FConvModel.build(SMALL, V_SRC, V_TGT).train()
    src, lengths = batch([3, 5, 2])
    seen: list[SearchBatch] = []

    def search(b: SearchBatch):
        seen.append(b)
        assert torch.is_inference_mode_enabled() and not model.training
        return [["found"]]

    assert run_search(search, model, src, lengths, settings()) == [["found"]]
    (b,) = seen
    assert b.src_tokens is src and b.src_lengths is lengths and b.src_lens == [3, 5, 2]
    assert b.limits == max_lengths([3, 5, 2], 0.5, 4, b.model.max_target_positions(), 1, 5)
    assert model.training  # the generation mode is left again


def test_run_search_answers_an_empty_batch_and_refuses_bad_settings():
    model = FConvModel.build(SMALL, V_SRC, V_TGT)
    empty = torch.zeros((0, 4), dtype=torch.long), torch.zeros(0, dtype=torch.long)
    assert run_search(lambda b: pytest.fail("searched"), model, *empty, settings()) == []
    src, lengths = batch([3, 5])
    with pytest.raises(ValueError, match="nbest"):
        run_search(lambda b: [], model, src, lengths, settings(nbest=4))
    with pytest.raises(ValueError, match="src_lengths"):
        run_search(lambda b: [], model, src, torch.tensor([3, 9]), settings())
