"""Every key of a composed config must be one the schema knows: a misspelt key fails, `+` or not.

Hydra's structured schema (the task's, `convseq.tasks.config.TASK_CONFIGS`) refuses `optim.lrr=0.1`, but a leading
`+` (`+optim.lrr=0.1`) opens the node and appends the key, and the run would train with
`optim.lr` at its default. `check_keys` walks the composed config against the schema after
composition and refuses any key the schema does not have, with the closest known keys
suggested. Open nodes stay open: a field typed as a dict (`data.test_sets`) or `Any`
(`trainer.devices`, `resume`) takes whatever is put under it, so a user's own group or key goes
there.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from convseq.errors import ConvseqError
from convseq.models.family import MODEL_KEYS
from convseq.tasks.config import TASK_CONFIGS, keys_schema

__all__ = [
    "ConfigKeyError",
    "check_key",
    "check_keys",
    "family_key_message",
    "has_key",
    "schema_tree",
    "suggestions",
]

# A schema node: the known keys below it, each mapping to its own node, or None where the
# schema is open (a dict-, list- or Any-typed field, or a plain value).
SchemaTree = dict[str, "SchemaTree | None"]

IGNORED_ROOT_KEYS = ("hydra",)  # Hydra's own node, present when its config is returned too
# keys that were removed for another that holds the same value: the message names the new one
MOVED_KEYS = {"data.batch_tokens": "batching.max_tokens"}


class ConfigKeyError(ConvseqError, KeyError):
    """A key of the composed config that the schema does not know."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def schema_tree(schema: type, cfg: Any = None) -> SchemaTree:
    """The keys of `schema` (a dataclass), nested; None marks a node that takes any key.

    An open field whose metadata names a schema (``metadata={"schema": DataConfig}``: the data
    settings of a task that reads a checkpoint) has that schema's keys. A field typed by its
    value (``schema_of``: the `model` node, whose keys are its family's) has the keys of the
    schema `cfg`'s value names, or without `cfg` those of all its schemas together.
    """
    tree: SchemaTree = {}
    for f in dataclasses.fields(schema):
        if "schema_of" in f.metadata:
            tree[f.name] = _family_tree(f, cfg)
            continue
        kind = keys_schema(f) or _dataclass_of(f)
        tree[f.name] = schema_tree(kind) if kind is not None else None
    return tree


def _family_tree(f: dataclasses.Field, composed: Any) -> SchemaTree:
    """The keys of field `f`'s schema for the value it has in `composed`, else of them all."""
    has = isinstance(composed, (Mapping, DictConfig)) and f.name in composed
    value = composed[f.name] if has else None
    if isinstance(value, (Mapping, DictConfig)):
        return schema_tree(f.metadata["schema_of"](value))
    tree: SchemaTree = {}
    for kind in f.metadata["schemas"]:
        tree.update(schema_tree(kind))
    return tree


def _dataclass_of(f: dataclasses.Field) -> type | None:
    """The dataclass a field holds, or None. Annotations may be strings (postponed evaluation),
    so the field's default tells: a nested schema's default is an instance of it."""
    if f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        default = f.default
    return type(default) if dataclasses.is_dataclass(default) else None


def check_keys(cfg: DictConfig | Mapping[str, Any], tree: SchemaTree, task: str = "") -> None:
    """Refuse the first key of `cfg` the schema (`tree`, of `task`) does not know.

    Raises:
        ConfigKeyError: naming the key's dotted path and the closest known keys.
    """
    plain = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg
    for path in _unknown(plain, tree, ""):
        raise ConfigKeyError(_family_message(path, plain, task) or _message(path, tree, task))


def check_key(path: str, tree: SchemaTree, task: str = "") -> None:
    """Refuse the dotted key `path` (e.g. from the command line) unless the schema has it.

    Raises:
        ConfigKeyError: as `check_keys`.
    """
    node: SchemaTree | None = tree
    for part in path.split("."):
        if node is None:
            return  # below an open node
        if part not in node:
            raise ConfigKeyError(_message(path, tree, task))
        node = node[part]


def has_key(path: str, tree: SchemaTree) -> bool:
    """Whether the schema `tree` knows the dotted key `path` (below an open node: yes)."""
    node: SchemaTree | None = tree
    for part in path.split("."):
        if node is None:
            return True
        if part not in node:
            return False
        node = node[part]
    return True


def _unknown(cfg: Any, tree: SchemaTree | None, prefix: str) -> Iterator[str]:
    if tree is None or not isinstance(cfg, Mapping):
        return
    for key, value in cfg.items():
        if not prefix and key in IGNORED_ROOT_KEYS:
            continue
        path = f"{prefix}{key}"
        if key not in tree:
            yield path
        else:
            yield from _unknown(value, tree[key], f"{path}.")


def family_key_message(path: str, schema: type) -> str | None:
    """Where `path` (e.g. ``model.encoder_conv_type``) is a key of another model family's
    config than `schema`'s (the family the preset chose), a message that says whose; else None."""
    node, _, key = path.rpartition(".")
    family = getattr(schema, "family", None)
    if "." in node or family is None:
        return None
    owners = [
        kind.family
        for kind in MODEL_KEYS["schemas"]
        if kind is not schema and key in {f.name for f in dataclasses.fields(kind)}
    ]
    if not owners:
        return None
    return (
        f"unknown config key {path} for a model of the {family} family: it is a key of the "
        f"{' and '.join(owners)} family's models: choose one of their presets (model=NAME; "
        "`python run.py --help` lists conf/model/)"
    )


def _family_message(path: str, plain: Any, task: str) -> str | None:
    """`family_key_message` where `path` lies under a field typed by its value (`model`)."""
    top = path.split(".")[0]
    schema = TASK_CONFIGS.get(task)
    fields = {f.name: f for f in dataclasses.fields(schema)} if schema else {}
    if top not in fields or "schema_of" not in fields[top].metadata:
        return None
    return family_key_message(path, fields[top].metadata["schema_of"](plain[top]))


def _message(path: str, tree: SchemaTree, task: str = "") -> str:
    owners = [
        t for t, schema in TASK_CONFIGS.items() if t != task and has_key(path, schema_tree(schema))
    ]
    if task and owners:  # a key of another task's config
        return (
            f"unknown config key {path} for task={task}: it is a key of "
            f"{' and '.join(f'task={t}' for t in owners)}; each task's config holds the keys it "
            f"uses (`python run.py task={task} --cfg job` prints them)"
        )
    close = [MOVED_KEYS[path]] if path in MOVED_KEYS else suggestions(path, tree)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    of = f"task={task}'s config" if task else "convseq's config"
    return (
        f"unknown config key {path}{hint}: {of} has no such key, and a leading + "
        "does not add one (only open nodes such as data.test_sets take new keys); "
        f"`python run.py{f' task={task}' if task else ''} --cfg job` prints every key with "
        "its value"
    )


def suggestions(path: str, tree: SchemaTree, n: int = 3) -> list[str]:
    """The known dotted keys closest to `path`: its siblings first, then any key of the schema
    whose last part is close to its last part (`trainer.lr` -> `optim.lr`)."""
    parts = path.split(".")
    parent, node = parts[:-1], tree
    for part in parent:
        child = node.get(part) if node is not None else None
        if child is None:
            node = None
            break
        node = child
    prefix = ".".join(parent) + "." if parent else ""
    found = []
    if node:
        found = [prefix + k for k in difflib.get_close_matches(parts[-1], list(node), n, 0.6)]
    if len(found) < n:
        leaves = {p: p.rsplit(".", 1)[-1] for p in _paths(tree, "")}
        close = difflib.get_close_matches(parts[-1], sorted(set(leaves.values())), n, 0.8)
        found += [p for p, leaf in sorted(leaves.items()) if leaf in close and p not in found]
    return found[:n]


def _paths(tree: SchemaTree, prefix: str) -> Iterator[str]:
    for key, child in tree.items():
        yield prefix + key
        if child is not None:
            yield from _paths(child, f"{prefix}{key}.")
