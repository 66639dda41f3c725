"""The helpers every layer shares: the special-token ids, this process's rank (plain and typed
configs: test_config.py)."""

from __future__ import annotations

from types import SimpleNamespace

from convseq.common.distributed import rank_and_world
from convseq.common.specials import BOS_ID, EOS_ID, PAD_ID, SPECIAL_SYMBOLS, UNK_ID
from convseq.data.dataset import LanguagePairDataset
from convseq.data.dictionary import Dictionary
from convseq.search.interface import IncrementalDecoderModel


def test_the_special_ids_are_the_dictionarys_and_the_collaters_and_the_searchs():
    d = Dictionary()
    assert d.symbols == list(SPECIAL_SYMBOLS)
    assert (d.bos(), d.pad(), d.eos(), d.unk()) == (BOS_ID, PAD_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    dataset = LanguagePairDataset([[5, 2]], None)
    assert (dataset.pad, dataset.eos) == (PAD_ID, EOS_ID)
    search = IncrementalDecoderModel(SimpleNamespace(decoder=SimpleNamespace()))
    assert (search.pad, search.eos, search.unk) == (PAD_ID, EOS_ID, UNK_ID)


def test_rank_and_world_come_from_the_trainer_else_from_the_process_group():
    assert rank_and_world() == (0, 1)  # no process group in the tests
    assert rank_and_world(SimpleNamespace(global_rank=2, world_size=4)) == (2, 4)
