"""conf/local/default.yaml, this machine's settings, comes after the root config's own keys and
before an experiment: it sets root keys, group values and group choices; an experiment's recipe
and the command line still win over it (conf/config.yaml's defaults list)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from convseq.common.config import plain as to_plain
from tests.conftest import CONF_DIR, compose_config

LOCAL = """\
# @package _global_
defaults:
  - override /optim: adam   # a group choice
seed: 7                     # a root key of conf/config.yaml
trainer:
  threads: 3                # a group value (conf/trainer/default.yaml: null)
optim:
  lr: 0.5
"""


@pytest.fixture
def conf_with_local(tmp_path) -> Path:
    """A copy of conf/ whose local/ holds only the test's default.yaml (a real conf/local/ of
    this machine is neither read nor touched)."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf, ignore=shutil.ignore_patterns("local"))
    (conf / "local").mkdir()
    (conf / "local" / "default.yaml").write_text(LOCAL)
    return conf


def composed(overrides: list[str], conf: Path, tmp_path: Path) -> dict:
    return to_plain(compose_config(overrides, output_dir=str(tmp_path / "run"), conf_dir=conf))


def test_a_local_file_sets_root_keys_group_values_and_choices(conf_with_local, tmp_path):
    cfg = composed([], conf_with_local, tmp_path)
    assert cfg["seed"] == 7  # over conf/config.yaml's seed: 1
    assert cfg["trainer"]["threads"] == 3
    assert cfg["optim"]["name"] == "adam" and cfg["optim"]["lr"] == 0.5
    # without it, the root's and the groups' own values
    (conf_with_local / "local" / "default.yaml").unlink()
    plain = composed([], conf_with_local, tmp_path)
    assert (plain["seed"], plain["trainer"]["threads"], plain["optim"]["name"]) == (1, None, "nag")
    assert plain["optim"]["lr"] != 0.5


def test_an_experiment_and_the_command_line_win_over_a_local_file(conf_with_local, tmp_path):
    recipe = composed(["experiment=multi30k_fconv"], conf_with_local, tmp_path)
    assert recipe["optim"]["name"] == "nag" and recipe["optim"]["lr"] == 0.25  # the recipe's
    assert recipe["seed"] == 7 and recipe["trainer"]["threads"] == 3  # keys it does not set
    given = composed(["seed=9", "trainer.threads=1"], conf_with_local, tmp_path)
    assert given["seed"] == 9 and given["trainer"]["threads"] == 1
