"""The helpers every layer shares: plain configs, the special-token ids, this process's rank."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

from convseq.common.distributed import rank_and_world
from convseq.common.plain import to_plain
from convseq.common.specials import BOS_ID, EOS_ID, PAD_ID, SPECIAL_SYMBOLS, UNK_ID
from convseq.data.dataset import LanguagePairDataset
from convseq.data.dictionary import Dictionary
from convseq.search.interface import IncrementalDecoderModel


def test_to_plain_resolves_omegaconf_containers_and_passes_anything_else():
    cfg = OmegaConf.create({"lr": 0.25, "warm": "${lr}", "layers": [[512, 3]]})
    plain = to_plain(cfg)
    assert plain == {"lr": 0.25, "warm": 0.25, "layers": [[512, 3]]}
    assert type(plain) is dict and type(plain["layers"]) is list
    assert to_plain(OmegaConf.create([1, "${0}"])) == [1, 1]
    mapping = {"name": "nag"}
    assert to_plain(mapping) is mapping
    assert to_plain(None) is None and to_plain(3) == 3


def test_to_plain_refuses_a_missing_value():
    with pytest.raises(MissingMandatoryValue):
        to_plain(OmegaConf.create({"output_dir": "???"}))


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
