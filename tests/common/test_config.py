"""`convseq.common.config`: `plain` (a config as plain dicts and lists, what a checkpoint keeps)
and `typed` (a config dataclass of a mapping from outside, every key and type checked)."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

from convseq.common.config import TrainerConfig, plain, typed
from convseq.errors import SettingError
from convseq.models.config import FConvConfig, ModelConfigError
from convseq.optim.config import OPTIMIZER_DEFAULTS, AnnealConfig, OptimConfig
from convseq.training.config import TrainConfig
from tests.conftest import compose_config

# ------------------------------------------------------------------------------------------ plain


def test_plain_resolves_omegaconf_containers_and_passes_anything_else():
    cfg = OmegaConf.create({"lr": 0.25, "warm": "${lr}", "layers": [[512, 3]]})
    flat = plain(cfg)
    assert flat == {"lr": 0.25, "warm": 0.25, "layers": [[512, 3]]}
    assert type(flat) is dict and type(flat["layers"]) is list
    assert plain(OmegaConf.create([1, "${0}"])) == [1, 1]
    mapping = {"name": "nag"}
    assert plain(mapping) == mapping and type(plain(mapping)) is dict
    assert plain(None) is None and plain(3) == 3 and plain("x") == "x"


def test_plain_refuses_a_missing_value():
    with pytest.raises(MissingMandatoryValue):
        plain(OmegaConf.create({"output_dir": "???"}))


def test_plain_turns_dataclasses_into_dicts_nested_ones_too():
    optim = OptimConfig(lr=0.5, betas=[0.9, 0.98])
    flat = plain(optim)
    assert flat == dataclasses.asdict(optim) and type(flat) is dict
    assert flat["betas"] == [0.9, 0.98] and type(flat["betas"]) is list
    root = plain(TrainConfig())
    assert type(root["gen"]) is dict and root["gen"]["beam"] == 5
    assert root["optim"] == dataclasses.asdict(OPTIMIZER_DEFAULTS["nag"])
    # inside a mapping, a list or a tuple too; a tuple becomes a list
    mixed = plain({"a": AnnealConfig(name="lua"), "b": (OmegaConf.create({"x": "${y}", "y": 1}),)})
    assert mixed == {"a": dataclasses.asdict(AnnealConfig(name="lua")), "b": [{"x": 1, "y": 1}]}
    assert type(mixed["a"]) is dict and type(mixed["b"][0]) is dict
    # the class itself is no config: left as it is
    assert plain(OptimConfig) is OptimConfig


def test_plain_of_a_composed_group_equals_plain_of_its_typed_group():
    composed = compose_config(["optim=adam"]).optim
    assert plain(typed(OptimConfig, composed, "optim")) == plain(composed)


# ------------------------------------------------------------------------------------------ typed


def test_typed_returns_an_instance_as_it_is():
    one = OptimConfig(lr=0.5)
    assert typed(OptimConfig, one, "optim") is one  # no copy, no conversion
    trainer = TrainerConfig(threads=2)
    assert typed(TrainerConfig, trainer) is trainer


def test_typed_merges_a_mapping_onto_the_schemas_defaults():
    got = typed(OptimConfig, {"name": "sgd", "lr": 2}, "optim")
    assert type(got) is OptimConfig
    assert got == dataclasses.replace(OptimConfig(), name="sgd", lr=2.0)
    assert type(got.lr) is float  # converted to the schema's type
    assert typed(OptimConfig, None, "optim") == OptimConfig()
    assert typed(OptimConfig, {}, "optim") == OptimConfig()
    # an Any key keeps the value's own type: 2 batches stay 2, not 2.0
    assert typed(TrainerConfig, {"limit_val_batches": 2}).limit_val_batches == 2
    assert typed(TrainerConfig, {"devices": [0, 1]}).devices == [0, 1]
    # a DictConfig, interpolations resolved
    node = OmegaConf.create({"lr": 0.5, "weight_decay": "${lr}"})
    assert typed(OptimConfig, node, "optim").weight_decay == 0.5


def test_typed_nests_the_groups_of_the_root_config():
    paths = {"data_root": "/d", "cache_dir": "/c", "output_dir": "/o"}
    data = {"name": "toy", "dir": None, "src_lang": "src", "tgt_lang": "tgt"}
    given = {"paths": paths, "data": data, "optim": {"lr": 0.5}, "gen": {"beam": 2}}
    cfg = typed(TrainConfig, given, "config")
    assert type(cfg.optim) is OptimConfig and cfg.optim.lr == 0.5
    assert cfg.optim.momentum == OptimConfig.momentum and cfg.gen.beam == 2
    assert cfg.paths.output_dir == "/o"
    # a value the schema leaves missing (???) is named too
    with pytest.raises(SettingError, match=r"^config\.paths\.data_root: .*missing"):
        typed(TrainConfig, {"data": data}, "config")


def test_typed_makes_a_composed_group_into_its_dataclass():
    optim = typed(OptimConfig, compose_config(["optim=sgd"]).optim, "optim")
    assert type(optim) is OptimConfig and optim == OPTIMIZER_DEFAULTS["sgd"]
    adam = typed(OptimConfig, compose_config(["optim=adam"]).optim, "optim")
    assert adam == OPTIMIZER_DEFAULTS["adam"] and type(adam.betas) is list  # no ListConfig left


def test_an_unknown_key_is_named_with_the_keys_there_are():
    known = sorted(f.name for f in dataclasses.fields(OptimConfig))
    with pytest.raises(SettingError, match=r"^optim\.lrr: ") as info:
        typed(OptimConfig, {"lrr": 2}, "optim")
    assert f"the keys of optim are {known}" in str(info.value)
    # nested: the keys of the group that lacks it, not the root's
    with pytest.raises(SettingError, match=r"^config\.optim\.lrr: ") as info:
        typed(TrainConfig, {"optim": {"lrr": 2}}, "config")
    assert f"the keys of config.optim are {known}" in str(info.value)
    # without a prefix, the key and the schema's name
    with pytest.raises(SettingError, match=r"^lrr: .*the keys of OptimConfig are \[") as info:
        typed(OptimConfig, {"lrr": 2})


def test_a_wrong_type_names_the_key():
    with pytest.raises(SettingError, match=r"^optim\.lr: .*'abc'"):
        typed(OptimConfig, {"lr": "abc"}, "optim")
    with pytest.raises(SettingError, match=r"^trainer\.threads: .*'x'"):
        typed(TrainerConfig, {"threads": "x"}, "trainer")
    with pytest.raises(SettingError, match=r"^config\.anneal\.lr_patience: "):
        typed(TrainConfig, {"anneal": {"lr_patience": "soon"}}, "config")


def test_not_a_mapping_is_refused():
    with pytest.raises(
        SettingError, match=r"^optim: expected a OptimConfig or a mapping .*got int"
    ):
        typed(OptimConfig, 3, "optim")
    with pytest.raises(SettingError, match=r"^optim: .*got AnnealConfig"):
        typed(OptimConfig, AnnealConfig(), "optim")  # another group's dataclass


def test_typed_raises_the_callers_error():
    with pytest.raises(ModelConfigError, match=r"^model\.dropout: "):
        typed(FConvConfig, {"dropout": "high"}, "model", ModelConfigError)
