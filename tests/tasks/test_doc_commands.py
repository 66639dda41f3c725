"""The commands and keys docs/from_fairseq.md and docs/ecosystem.md give compose as written.

Each `python run.py ...` command of the two pages is composed with the real configs (a misspelt
key, a group option that does not exist or a wrong type fails here), and every bare key named
in from_fairseq.md's flag table (`trainer.max_epochs`, `data.src_dict`, ...) must be a key of
the schema.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from convseq.cli.config_check import check_key, check_keys, has_key, schema_tree
from convseq.tasks.config import TASK_CONFIGS, task_name
from tests.conftest import compose_config

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ("from_fairseq.md", "ecosystem.md")
CODE = re.compile(r"`([^`]+)`")
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
# values that stand for a path or a name the reader fills in
HYDRA_ONLY = ("hydra.run.dir=", "hydra.sweep.dir=")


def _commands(page: str) -> list[str]:
    """The `python run.py ...` spans of a page, without what precedes `python` (env vars)."""
    text = (DOCS / page).read_text(encoding="utf-8")
    blocks = FENCE.findall(text)  # fenced blocks: one command a line, comments dropped
    spans = [line.split("#")[0] for block in blocks for line in block.splitlines()]
    spans += [m.group(1) for m in CODE.finditer(FENCE.sub("", text))]
    return [s[s.index("python run.py") :] for s in spans if "python run.py" in s]


def _overrides(command: str) -> list[str]:
    """The command's overrides, as composing needs them (no -m, no hydra.run/sweep folder)."""
    words = shlex.split(command)[2:]  # after `python run.py`
    overrides = [w for w in words if "=" in w and not w.startswith(HYDRA_ONLY)]
    if "-m" in words:  # a sweep: compose its first job (a=x,y -> a=x)
        overrides = [o if "[" in o else o.split(",")[0] for o in overrides]
    return overrides


def _cases() -> list[tuple[str, str]]:
    return [(page, cmd) for page in PAGES for cmd in _commands(page)]


def test_the_pages_hold_the_commands_the_issue_lists():
    commands = " ".join(cmd for _, cmd in _cases())
    for words in (
        "task=generate",
        "task=interactive",
        "task=average",
        "task=compare",
        "task=preprocess",
        "logger=tensorboard",
        "logger=many",
        "hparams_search=toy_optuna",
        "data=fairseq",
        "hydra/launcher=slurm",
    ):
        assert words in commands, words


@pytest.mark.parametrize(("page", "command"), _cases(), ids=lambda v: str(v)[:60])
def test_each_documented_command_composes(page, command):
    overrides = _overrides(command)
    if "hydra/launcher=slurm" in overrides:
        if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
            pytest.skip("hydra/launcher=slurm needs the slurm extra")
    if any(o.startswith("hparams_search=") for o in overrides):
        if importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is None:
            pytest.skip("hparams_search needs the sweep extra")
    # a `data=mycorpus` page example names the reader's own config file: compose with toy data
    overrides = ["data=toy" if o == "data=mycorpus" else o for o in overrides]
    cfg = compose_config(overrides)
    _check_keys(cfg)  # no key outside the schema (Hydra lets `+`-less open nodes through)


def _check_keys(cfg) -> None:
    """Every key of the composed `cfg` is one its task's schema knows."""
    task = task_name(cfg)
    check_keys(cfg, schema_tree(TASK_CONFIGS[task]), task)


def _check_key_of_a_task(key: str) -> None:
    """`key` is a key of some task's config (each task's config holds the keys it reads)."""
    if not any(has_key(key, schema_tree(schema)) for schema in TASK_CONFIGS.values()):
        check_key(key, schema_tree(TASK_CONFIGS["train"]), "train")  # raises, naming the key


def _flag_table_keys() -> list[str]:
    """Bare keys (no `=`) in the convseq column of from_fairseq.md's flag table."""
    text = (DOCS / "from_fairseq.md").read_text(encoding="utf-8")
    table = text[text.index("## Flags and keys") :]
    keys = []
    for line in table.splitlines():
        if not line.startswith("| ") or line.startswith("| fairseq |"):
            continue
        convseq = line.split(" | ")[-1]
        words = [w for span in CODE.findall(convseq) for w in span.split()]
        words = [w for w in words if re.fullmatch(r"[a-z_.]+", w)]
        words = [w for w in words if not re.search(r"\.(ckpt|pt|txt)$", w)]  # not files
        if any("." in w for w in words):  # a cell of keys (not one of values: `sentencepiece`)
            keys += words
    return keys


def test_every_bare_key_of_the_flag_table_exists():
    keys = _flag_table_keys()
    assert {"trainer.max_epochs", "max_update", "data.src_dict", "anneal.min_lr"} <= set(keys)
    for key in keys:
        _check_key_of_a_task(key)


def test_every_override_of_the_flag_table_composes():
    text = (DOCS / "from_fairseq.md").read_text(encoding="utf-8")
    table = text[text.index("## Flags and keys") :]
    rows = [line.split(" | ")[-1] for line in table.splitlines()[4:] if line.startswith("| ")]
    assert len(rows) >= 30
    for row in rows:
        for span in CODE.findall(row):
            overrides = [w for w in span.split() if "=" in w and not w.startswith(HYDRA_ONLY)]
            # a span that names its task composes that task's config (conf/<task>.yaml)
            if overrides:
                _check_keys(compose_config(overrides))
