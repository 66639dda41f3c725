"""The command line composed before Hydra runs it: every configuration mistake is one line.

`check_composition` composes the task's primary config (conf/<task>.yaml) with the command
line's overrides, as run.py's `@hydra.main` then does, and turns what Hydra would print over
several lines (its search path, the `HYDRA_FULL_ERROR` hint, exit status 1) into one
`ConfigValueError` (run.py: one line, exit status 2):

- an unknown group option names the group's options and the closest (`optim=nagg`: did you
  mean optim=nag?);
- a value of the wrong type names the key, the value and the type the key takes
  (`optim.lr=abc`: optim.lr takes a float, not the string 'abc');
- anything else Hydra refuses (an override it cannot parse, a sweep without `-m`) is Hydra's
  message on one line.

Under `-m` each value of a sweep is checked: every option of a group sweep is composed, every
value of a key sweep is set on the composed config (an Optuna `interval(...)` is the
sweeper's). The composed config's keys are then checked against the task's schema
(`convseq.cli.config_check`), so that `+optim.lrr=0.1` fails here too.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    ConfigTypeError,
    OmegaConfBaseException,
    ValidationError,
)

from convseq.cli.config_check import check_keys, family_key_message, schema_tree
from convseq.cli.schema import compose_task, config_name
from convseq.common.config import typed
from convseq.errors import ConvseqError
from convseq.tasks.config import TASK_CONFIGS

__all__ = [
    "ConfigValueError",
    "check_composition",
    "expected_type",
    "is_group_override",
    "one_line",
    "parse_strictly",
]

# the words for a type a key takes, and for the type of a value given
TYPE_WORDS = {float: "a float", int: "an integer", bool: "true or false", str: "a string"}
PLURAL_WORDS = {float: "floats", int: "integers", bool: "booleans", str: "strings"}
VALUE_WORDS = {
    str: "the string",
    list: "the list",
    dict: "the mapping",
    bool: "the boolean",
    int: "the integer",
    float: "the number",
}
# OmegaConf's value nodes: the type, where the task's schema does not name it
NODE_TYPES = {"FloatNode": float, "IntegerNode": int, "BooleanNode": bool, "StringNode": str}


class ConfigValueError(ConvseqError, ValueError):
    """An override Hydra would refuse: an unknown group option, a value of the wrong type, an
    override it cannot parse or compose."""


def parse_strictly(args: Sequence[str]) -> list[Override]:
    """Hydra's parse of override strings.

    Raises:
        ConfigValueError: the override Hydra cannot read, with its reason on one line.
    """
    try:
        return OverridesParser.create().parse_overrides(list(args))
    except OverrideParseException as e:
        message = f"cannot read the override {e.override}: {one_line(e.message)}"
        raise ConfigValueError(message) from e


def is_group_override(override: Override, conf_dir: str | Path) -> bool:
    """Whether `override` chooses a group's option (`optim=nag`: conf/optim/ is a folder)
    rather than setting a key."""
    key = override.key_or_group
    return "/" in key or override.package is not None or (Path(conf_dir) / key).is_dir()


def check_composition(args: Sequence[str], conf_dir: str | Path, multirun: bool = False) -> None:
    """Compose the task's config with the overrides `args` (each value of a sweep where
    `multirun`), as run.py would, and check its keys.

    Raises:
        ConfigValueError: an unknown group option, a wrong type, or another Hydra refusal.
        convseq.cli.config_check.ConfigKeyError: a key the task's schema does not know.
    """
    task = config_name(args)
    overrides = parse_strictly(args)
    firsts = [_first_value(o) if multirun else o.input_line for o in overrides]
    cfg = _compose(conf_dir, [line for line in firsts if line is not None], task)
    if multirun:
        _check_sweeps(conf_dir, overrides, firsts, copy.deepcopy(cfg), task)


def _check_sweeps(
    conf_dir: str | Path,
    overrides: list[Override],
    firsts: list[str | None],
    cfg: DictConfig,
    task: str,
) -> None:
    """Each value but the first of each sweep: a group's option composed with the other
    overrides' first values, a key's value set on (a copy of) the first composition."""
    for i, override in enumerate(overrides):
        if firsts[i] is None or not override.is_sweep_override():
            continue
        if override.is_hydra_override():
            raise ConfigValueError(
                f"{override.input_line}: a sweep over Hydra's own settings is not supported; "
                "give each its own run"
            )
        for value in list(override.sweep_string_iterator())[1:]:
            line = f"{override.get_key_element()}={value}"
            if is_group_override(override, conf_dir):
                others = [x for j, x in enumerate(firsts) if j != i and x is not None]
                _compose(conf_dir, [*others, line], task)
            else:
                _set_value(cfg, line, task)


def _first_value(override: Override) -> str | None:
    """The override with the first value of its sweep; None for an Optuna interval."""
    if not override.is_sweep_override():
        return override.input_line
    if override.value_type == ValueType.INTERVAL_SWEEP:
        return None
    first = next(iter(override.sweep_string_iterator()), None)
    return None if first is None else f"{override.get_key_element()}={first}"


def _compose(conf_dir: str | Path, lines: list[str], task: str) -> DictConfig:
    try:
        cfg = compose_task(conf_dir, lines)
    except MissingConfigException as e:
        raise ConfigValueError(_option_message(e, lines, task)) from e
    except HydraException as e:
        raise ConfigValueError(_composition_message(e, lines, task)) from e
    except (OmegaConfBaseException, AssertionError) as e:  # Hydra's, unwrapped
        message = f"{' '.join(lines)}: cannot compose it: {type(e).__name__}: {one_line(str(e))}"
        raise ConfigValueError(message) from e
    check_keys(cfg, schema_tree(TASK_CONFIGS[task], cfg), task)
    _check_family_values(cfg, task)
    return cfg


def _check_family_values(cfg: DictConfig, task: str) -> None:
    """Type the fields typed by their value (`model`) as dispatch will, so that a value the
    family's config refuses (``model.encoder_conv_type=dynamc``) fails here too (--cfg job)."""
    for f in dataclasses.fields(TASK_CONFIGS[task]):
        if "schema_of" in f.metadata and f.name in cfg:
            try:
                typed(f.metadata["schema_of"](cfg[f.name]), cfg[f.name], f.name)
            except ConvseqError as e:
                raise ConfigValueError(str(e)) from e


def _set_value(cfg: DictConfig, line: str, task: str) -> None:
    """Set one value of a key sweep on the composed config `cfg`, as Hydra would."""
    override = parse_strictly([line])[0]
    force_add = override.is_add() or override.is_force_add()
    try:
        OmegaConf.update(cfg, override.key_or_group, override.value(), force_add=force_add)
    except (ConfigKeyError, ConfigAttributeError):
        return  # the first value's composition took the key: not this value's mistake
    except OmegaConfBaseException as e:
        raise ConfigValueError(_value_message(e, line, override, task)) from e


def _option_message(e: MissingConfigException, lines: list[str], task: str) -> str:
    missing = str(e.missing_cfg_file or "")
    group, _, option = missing.rpartition("/")
    for override in parse_strictly(lines):  # the option as given (batch_sizes=sentences/x)
        key = override.key_or_group
        if missing.startswith(f"{key}/"):
            group, option = key, missing[len(key) + 1 :]
    options = sorted(e.options or [])
    if not group:
        return one_line(str(e))
    where = re.match(r"In '([^']+)'", str(e))  # the config whose defaults list names it
    named_in = where[1] if where else task
    within = "" if named_in in (task, "hydra/config") else f" (named in conf/{named_in}.yaml)"
    if not options:
        return f"unknown option {group}={option}{within}: conf/{group}/ has no {option}.yaml"
    close = difflib.get_close_matches(option, options, 3, 0.6)
    hint = f" (did you mean {' or '.join(f'{group}={c}' for c in close)}?)" if close else ""
    return f"unknown option {group}={option}{hint}{within}: the options of {group} are " + (
        ", ".join(options)
    )


def _composition_message(e: HydraException, lines: list[str], task: str) -> str:
    cause = e.__cause__
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):  # another model family's key
        message = family_key_message(str(cause.full_key), cause.object_type)
        if message is not None:
            return message
    if isinstance(cause, (ValidationError, ConfigTypeError)):
        key = str(cause.full_key)
        for line in reversed(lines):
            override = parse_strictly([line])[0]
            if override.key_or_group == key:
                return _value_message(cause, line, override, task)
    text = str(e)
    if isinstance(cause, OmegaConfBaseException):
        text += f": {cause.msg}" if getattr(cause, "msg", None) else f": {cause}"
    return one_line(text)


def _value_message(e: OmegaConfBaseException, line: str, override: Override, task: str) -> str:
    key = override.key_or_group
    expected = expected_type(TASK_CONFIGS[task], key)
    if expected is None:
        node_type = NODE_TYPES.get(type(getattr(e, "child_node", None)).__name__)
        expected = _type_words(node_type) if node_type is not None else None
    value = override.value()
    given = "null" if value is None else f"{VALUE_WORDS.get(type(value), 'the value')} {value!r}"
    if expected is None:
        return f"{line}: {key} cannot take {given}: {one_line(str(getattr(e, 'msg', e)))}"
    return f"{line}: {key} takes {expected}, not {given}"


def expected_type(schema: type, path: str) -> str | None:
    """The type the dotted key `path` of the dataclass `schema` takes, in words ("a float",
    "an integer or null", "a list of strings"); None where the schema does not type it."""
    node: Any = schema
    hint: Any = None
    for part in path.split("."):
        if not dataclasses.is_dataclass(node):
            return None
        try:
            hint = typing.get_type_hints(node).get(part)
        except (NameError, TypeError):
            return None
        if hint is None:
            return None
        node = hint
    return _type_words(hint)


def _type_words(hint: Any) -> str | None:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        words = [_type_words(a) for a in args]
        nullable = len(args) < len(typing.get_args(hint))
        if None in words:
            return None
        return " or ".join([*words, *(["null"] if nullable else [])])  # type: ignore[list-item]
    if origin in (list, tuple, Sequence):
        inner = PLURAL_WORDS.get(args[0]) if args else None
        return f"a list of {inner}" if inner else "a list"
    if origin is dict or hint is dict:
        return "a mapping"
    if isinstance(hint, type) and issubclass(hint, Enum):
        return "one of " + ", ".join(m.name for m in hint)
    return TYPE_WORDS.get(hint)


def one_line(text: str) -> str:
    """Hydra's message on one line, without its search path."""
    text = re.split(r"\n(?:Config )?[Ss]earch path:", text)[0]
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())
