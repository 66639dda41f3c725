"""The real conf/ tree: every option of every group composes; typos and wrong types are refused."""

from __future__ import annotations

import os

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from convseq.common.config import plain as to_plain
from convseq.data.corpus_dir import generated_dir
from tests.conftest import CONF_DIR, ROOT, compose_config

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "local")
# `# @package _global_` options: they set keys of other groups (batch_sizes: none, it is a name
# that the batching options look their sizes up by)
GLOBAL_GROUPS = ("batch_sizes", "experiment", "hparams_search")


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


ALL_OPTIONS = [(g, o) for g in GROUPS for o in _options(g)]


def test_every_group_has_options():
    for group in ("data", "batching", "model", "optim", "anneal", "trainer", "paths"):
        assert _options(group), f"conf/{group}/ has no options"


@pytest.mark.parametrize(("group", "option"), ALL_OPTIONS, ids=[f"{g}={o}" for g, o in ALL_OPTIONS])
def test_every_option_composes_and_resolves(group, option, tmp_path, cache_dir):
    # hparams_search options extend the Optuna plugin's settings (the sweep extra)
    if group == "hparams_search":
        pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    cfg = compose_config([f"{group}={option}"], output_dir=str(tmp_path))
    plain = to_plain(cfg)  # resolves every interpolation: nothing may stay MISSING
    if group in GLOBAL_GROUPS:
        assert group not in plain  # merged into the top level, not a key of its own
        if group == "experiment":
            # one "best" per run: summary.json's best_epoch and what a sweeper gets are by
            # optimized_metric, best.ckpt (the one tested and exported) by checkpoint.monitor
            assert plain["optimized_metric"] == plain["checkpoint"]["monitor"], (
                f"experiment={option}: optimized_metric {plain['optimized_metric']} but "
                f"checkpoint.monitor {plain['checkpoint']['monitor']}"
            )
        return
    assert isinstance(plain[group], dict)
    if "name" in plain[group]:
        # a group option's `name` says which option it is (reports and sweeps rely on it)
        assert plain[group]["name"] == option or group in ("data",)


def test_defaults_are_the_toy_setup(tmp_path, cache_dir):
    cfg = to_plain(compose_config([], output_dir=str(tmp_path)))
    assert cfg["task"] == "train"
    assert cfg["data"]["name"] == "toy" and cfg["data"]["generator"] == "toy"
    assert cfg["model"]["arch"] == "fconv_toy"
    assert cfg["optim"]["name"] == "nag" and cfg["batching"]["name"] == "tokens"
    # the toy corpus is generated into the cache, never into the project or the cwd: the toy
    # group leaves data.dir unset, and the generator's folder is in the cache
    assert cfg["data"]["dir"] is None
    folder = generated_dir(cfg["paths"]["cache_dir"], "toy", cfg["data"]["generator_seed"])
    assert folder.is_relative_to(cache_dir)


def test_paths_are_absolute_and_follow_the_environment(tmp_path, monkeypatch, cache_dir):
    monkeypatch.setenv("CONVSEQ_DATA_ROOT", "relative/data")
    cfg = to_plain(compose_config(["data=multi30k"], output_dir=str(tmp_path)))
    assert cfg["paths"]["data_root"] == os.path.join(os.getcwd(), "relative", "data")
    assert cfg["data"]["dir"] == os.path.join(os.getcwd(), "relative", "data", "multi30k")
    assert cfg["paths"]["cache_dir"] == str(cache_dir)
    monkeypatch.delenv("CONVSEQ_DATA_ROOT")
    cfg = to_plain(compose_config(["data=multi30k"], output_dir=str(tmp_path)))
    assert cfg["paths"]["data_root"] == os.path.join(os.getcwd(), "data")


def test_unknown_key_is_refused_with_its_name(tmp_path):
    with pytest.raises(ConfigCompositionException) as e:
        compose_config(["model.encoder_embed_dimm=3"])
    assert "encoder_embed_dimm" in str(e.value.__cause__ or e.value)


def test_unknown_top_level_key_is_refused():
    with pytest.raises(ConfigCompositionException) as e:
        compose_config(["learning_rate=3"])
    assert "learning_rate" in str(e.value.__cause__ or e.value)


def test_wrong_type_is_refused_with_its_key():
    with pytest.raises(ConfigCompositionException) as e:
        compose_config(["batching.max_tokens=lots"])
    msg = str(e.value.__cause__ or e.value)
    assert "max_tokens" in msg and "lots" in msg


def test_unknown_group_option_lists_the_valid_choices():
    with pytest.raises(MissingConfigException) as e:
        compose_config(["optim=adamw"])
    msg = str(e.value)
    assert "adamw" in msg
    for option in _options("optim"):
        assert option in msg


def test_schema_checks_yaml_files_too(tmp_path):
    # A typo inside a group file (not on the command line) fails the same way.
    from convseq.training.config import TrainConfig  # task=train's schema (conf/train.yaml)

    schema = OmegaConf.structured(TrainConfig)
    bad = OmegaConf.create({"optim": {"name": "nag", "momentun": 0.9}})
    with pytest.raises(ConfigKeyError):
        OmegaConf.merge(schema, bad)
    with pytest.raises(ValidationError):
        OmegaConf.merge(schema, OmegaConf.create({"trainer": {"max_epochs": "many"}}))


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    commands = [line.strip() for line in ci.splitlines() if "pytest" in line]
    assert commands, ".ci/run runs no pytest command"
    for command in commands:
        assert command in readme, f"README does not show the CI command: {command}"


def test_token_budget_follows_the_corpus_preset_unless_overridden(tmp_path, cache_dir):
    toy = to_plain(compose_config([], output_dir=str(tmp_path)))
    assert toy["batching"]["max_tokens"] == 1000 and "batch_tokens" not in toy["data"]
    m30k = to_plain(compose_config(["data=multi30k"], output_dir=str(tmp_path)))
    assert m30k["batching"]["max_tokens"] == 4000
    mine = to_plain(compose_config(["batching.max_tokens=2500"], output_dir=str(tmp_path)))
    assert mine["batching"]["max_tokens"] == 2500
    sentences = to_plain(compose_config(["batching=sentences"], output_dir=str(tmp_path)))
    assert sentences["batching"]["max_tokens"] is None


def test_batch_limits_keep_lightnings_meaning_of_int_and_float(tmp_path):
    """An int is a number of batches, a float a fraction: 2 must not become 2.0 (= 200%)."""
    cfg = to_plain(
        compose_config(
            ["trainer.limit_val_batches=2", "trainer.limit_train_batches=0.5"],
            output_dir=str(tmp_path),
        )
    )
    assert cfg["trainer"]["limit_val_batches"] == 2
    assert isinstance(cfg["trainer"]["limit_val_batches"], int)
    assert cfg["trainer"]["limit_train_batches"] == 0.5
