"""Reading fairseq checkpoints without running code from them.

A fairseq checkpoint is a pickled dict. Besides tensors it holds an ``argparse.Namespace``
(``args``, and ``cfg["model"]`` for argparse-defined models such as fconv) and, in files written
by fairseq 0.10, an OmegaConf ``DictConfig`` (``cfg``). `read_checkpoint` loads it with
``torch.load(..., weights_only=True)``, whose unpickler refuses every global that is not on an
allowlist; for the duration of that one call it adds exactly the globals such files hold
(`ALLOWED_GLOBALS`). Anything else is refused with a `CheckpointError` that names it.

The OmegaConf classes (and NumPy's array classes, which fairseq's saved training metrics may
hold) are never instantiated: each is mapped to an inert record that only stores the pickled
attributes. `to_plain` then turns the records into dicts, lists and values, so no OmegaConf code
runs on the file's content and the result does not depend on the OmegaConf version that wrote
it (fairseq pins omegaconf<2.1; convseq runs 2.3).
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from convseq.errors import CheckpointError


class _Record:
    """Stands in for an allowlisted class: keeps what the pickle sets on it and runs nothing."""

    def __init__(self, *args: Any) -> None:  # reached only through REDUCE (e.g. numpy.dtype(...))
        self.__dict__["_args"] = args

    def __setstate__(self, state: Any) -> None:  # BUILD: store the state, interpret nothing
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["_state"] = state

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


class DictConfigRecord(_Record):
    """An OmegaConf DictConfig as pickled: ``_content`` maps keys to nodes."""


class ListConfigRecord(_Record):
    """An OmegaConf ListConfig as pickled: ``_content`` is a list of nodes."""


class ValueNodeRecord(_Record):
    """An OmegaConf AnyNode as pickled: ``_val`` is the value."""


class MetadataRecord(_Record):
    """OmegaConf node metadata (types, flags): kept opaque."""


class OpaqueRecord(_Record):
    """A NumPy array, dtype or scalar from fairseq's saved training metrics: kept opaque."""


def _plain_dict(*_args: Any) -> dict:
    """Stands in for ``collections.defaultdict(factory)``: a plain, empty dict.

    OmegaConf >= 2.1 pickles an empty ``defaultdict(dict)`` resolver cache in every node's
    metadata; the factory argument is ignored.
    """
    return {}


# Every global a fairseq translation checkpoint's (fconv, LightConv) pickle references, beyond the
# tensor, storage and OrderedDict globals torch's weights-only unpickler already allows. Keys are the names as the
# unpickler resolves them (protocol 2 writes builtins as __builtin__, and int as long).
ALLOWED_GLOBALS: dict[str, Any] = {
    # `args` of every fairseq release; also `cfg["model"]` (and sometimes `cfg["task"]`) of
    # argparse-defined models (fconv, LightConv), which fairseq stores as a Namespace in its cfg.
    "argparse.Namespace": argparse.Namespace,
    # fairseq 0.10 pickles its cfg as a DictConfig (later releases as a plain dict).
    "omegaconf.dictconfig.DictConfig": DictConfigRecord,
    "omegaconf.listconfig.ListConfig": ListConfigRecord,
    "omegaconf.nodes.AnyNode": ValueNodeRecord,  # fairseq's cfg is untyped: values are AnyNodes
    "omegaconf.base.Metadata": MetadataRecord,
    "omegaconf.base.ContainerMetadata": MetadataRecord,
    # type tags inside the node metadata: ref/key/element type Any, object type dict or list,
    # a ListConfig's key type int
    "typing.Any": typing.Any,
    "builtins.dict": dict,
    "builtins.list": list,
    "builtins.int": int,
    "collections.defaultdict": _plain_dict,  # the metadata's (empty) resolver cache
    # NumPy arrays and scalars in extra_state["metrics"] (fairseq logs BLEU counts as arrays)
    "numpy.ndarray": OpaqueRecord,
    "numpy.dtype": OpaqueRecord,
    "numpy.core.multiarray._reconstruct": OpaqueRecord,  # NumPy 1.x
    "numpy.core.multiarray.scalar": OpaqueRecord,
    "numpy._core.multiarray._reconstruct": OpaqueRecord,  # NumPy 2.x
    "numpy._core.multiarray.scalar": OpaqueRecord,
}


def _safe_globals() -> list[tuple[Any, str]]:
    return [(obj, name) for name, obj in ALLOWED_GLOBALS.items()]


def _refused_globals(path: Path, error: Exception) -> list[str]:
    """The globals in the file that are not allowed (all of them, when the pickle can be scanned)."""
    names: set[str] = set()
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        names = {n for n in unsafe if n not in ALLOWED_GLOBALS}
    except Exception:  # legacy (non-zip) files cannot be scanned; fall back to the message
        pass
    if not names:
        found = re.findall(r"GLOBAL ([\w.]+)", str(error))
        # torch drops the "builtins." prefix in its message
        names = {n if "." in n else f"builtins.{n}" for n in found}
    return sorted(names)


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a fairseq checkpoint's top-level dict without executing anything from the file.

    Raises:
        CheckpointError: the file is missing, truncated or not a PyTorch checkpoint, or its
            pickle references a global outside `ALLOWED_GLOBALS` (named in the message).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    try:
        # the allowlist is added for this call only, and removed again on exit
        with torch.serialization.safe_globals(_safe_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        refused = _refused_globals(path, e)
        if refused:
            # `from None`: torch's own message suggests unsafe loading, which convseq never does
            raise CheckpointError(
                f"{path}: refused to load: the file's pickle references {', '.join(refused)}, "
                "which is not among the globals a fairseq translation checkpoint holds (argparse "
                "Namespace, OmegaConf config nodes, tensors). Loading it could run code from "
                "the file, so convseq does not unpickle it."
            ) from None
        raise CheckpointError(
            f"{path}: cannot read the checkpoint ({_first_line(e)}); the file is truncated, "
            "damaged or not a PyTorch checkpoint"
        ) from e
    except Exception as e:  # zip, storage and EOF errors of a damaged or foreign file
        raise CheckpointError(
            f"{path}: not a readable PyTorch checkpoint ({_first_line(e)}); the file is "
            "truncated, damaged or of another kind"
        ) from e
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{path}: expected a fairseq checkpoint (a dict with 'model' and 'args' or 'cfg'), "
            f"got a {type(state).__name__}"
        )
    return state


def _first_line(error: Exception) -> str:
    """The error's type and first sentence, for a one-line message."""
    text = (str(error).strip().splitlines() or [""])[0]
    text = text.split(". ")[0][:200]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def to_plain(obj: Any) -> Any:
    """Turn OmegaConf records into dicts, lists and values (recursively, Namespaces included).

    Tensors and other values are returned as they are; metadata and NumPy records stay opaque.
    """
    if isinstance(obj, DictConfigRecord):
        content = obj.__dict__.get("_content")
        if isinstance(content, Mapping):
            return {k: to_plain(v) for k, v in content.items()}
        return content  # None, or a "???" / interpolation string
    if isinstance(obj, ListConfigRecord):
        content = obj.__dict__.get("_content")
        if isinstance(content, list):
            return [to_plain(v) for v in content]
        return content
    if isinstance(obj, ValueNodeRecord):
        return to_plain(obj.__dict__.get("_val"))
    if isinstance(obj, argparse.Namespace):
        return argparse.Namespace(**{k: to_plain(v) for k, v in vars(obj).items()})
    if isinstance(obj, Mapping):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_plain(v) for v in obj)
    return obj
