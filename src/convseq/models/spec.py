"""Layer specifications of the fconv encoder and decoder, and of the decoder's attention.

A layer is ``(out_channels, kernel_width, residual)``: ``residual`` = r > 0 adds the output of
the layer r steps back (1 = the previous layer, the default), 0 means no residual connection.

Accepted forms (all give a tuple of 3-tuples):

- fairseq's string form, read by a small safe parser (never ``eval``)::

      "[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2"

- a YAML list whose items are ``[C, k]``, ``[C, k, r]`` or the compact repeat form
  ``{layer: [C, k(, r)], repeat: N}``::

      encoder_layers:
        - {layer: [512, 3], repeat: 9}
        - {layer: [1024, 3], repeat: 4}
        - [2048, 1]
        - [2048, 1]

The decoder's attention is a bool (every layer), fairseq's string (``"True"``,
``"[True, False, True]"``) or a list with one bool per layer.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any

from convseq.common.config import plain
from convseq.errors import ConvseqError

LayerSpec = tuple[int, int, int]  # (out_channels, kernel_width, residual)

MAX_LAYERS = 1000  # a bound on repeats, so a typo like `* 10**9` fails fast instead of hanging


class SpecError(ConvseqError, ValueError):
    """A layer or attention specification in the model config is malformed."""


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _safe_literal(text: str, key: str) -> Any:
    """Evaluate a fairseq spec expression made of ints, bools, lists, tuples, `+` and `*` only."""

    def fail(node: ast.AST | None, why: str) -> SpecError:
        where = ""
        if node is not None:
            segment = ast.get_source_segment(text, node)
            where = f" at {segment!r}" if segment else ""
        return SpecError(
            f"model.{key}: cannot read {text!r}{where}: {why}. Use a list of (channels, kernel"
            f"[, residual]) tuples joined by '+' and repeated by '*', e.g. \"[(512, 3)] * 20\"."
        )

    def size(v: Any) -> int:
        return len(v) if isinstance(v, (list, tuple)) else 0

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            if _is_int(node.value) or isinstance(node.value, bool):
                return node.value
            raise fail(node, "only integers and True/False are allowed")
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [ev(e) for e in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                if _is_int(left) and _is_int(right):
                    return left + right
                if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
                    if size(left) + size(right) > MAX_LAYERS:
                        raise fail(node, f"more than {MAX_LAYERS} items")
                    return list(left) + list(right)
                raise fail(node, "'+' joins two lists (or two integers)")
            if _is_int(left) and _is_int(right):
                return left * right
            seq, times = (left, right) if _is_int(right) else (right, left)
            if not (isinstance(seq, (list, tuple)) and _is_int(times)):
                raise fail(node, "'*' repeats a list a whole number of times")
            if times < 0 or size(seq) * times > MAX_LAYERS:
                raise fail(node, f"a repeat count must lie in 0..{MAX_LAYERS}")
            return list(seq) * times
        raise fail(node, f"{type(node).__name__} is not allowed")

    text = text.strip()
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise fail(None, f"syntax error ({e.msg})") from None
    return ev(tree.body)


def _layer(item: Any, key: str, index: int) -> LayerSpec:
    """One `(C, k)` or `(C, k, r)` item, checked."""
    if not isinstance(item, (list, tuple)) or len(item) not in (2, 3):
        raise SpecError(
            f"model.{key}: layer {index} is {item!r}; expected [channels, kernel] or "
            "[channels, kernel, residual]"
        )
    if not all(_is_int(v) for v in item):
        raise SpecError(f"model.{key}: layer {index} is {item!r}; its entries must be integers")
    channels, kernel = item[0], item[1]
    residual = item[2] if len(item) == 3 else 1
    if channels < 1 or kernel < 1:
        raise SpecError(
            f"model.{key}: layer {index} is {item!r}; channels and kernel width must be >= 1"
        )
    # residual r reads the input of the layer r-1 steps back; the stack's input counts as one
    if not 0 <= residual <= index + 1:
        raise SpecError(
            f"model.{key}: layer {index} is {item!r}; residual must lie in 0..{index + 1} "
            "(0 = none, r = the output of the layer r steps back)"
        )
    return (channels, kernel, residual)


def parse_layers(value: Any, key: str = "encoder_layers") -> tuple[LayerSpec, ...]:
    """Read a layer specification in any accepted form.

    Args:
        value: fairseq's string form, or a (YAML) list of layers and repeat items.
        key: the config key, named in error messages.

    Returns:
        One ``(out_channels, kernel_width, residual)`` tuple per layer.

    Raises:
        SpecError: naming the key, the offending item and the expected form.
    """
    value = plain(value)  # a ListConfig must not leak into the model
    if isinstance(value, str):
        value = _safe_literal(value, key)
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise SpecError(
            f"model.{key}: expected a list of layers or fairseq's string form, got {value!r}"
        )
    layers: list[Any] = []
    for item in value:
        if isinstance(item, Mapping):
            if set(item) != {"layer", "repeat"}:
                raise SpecError(
                    f"model.{key}: repeat item {item!r} must have exactly the keys "
                    "'layer' and 'repeat', e.g. {layer: [512, 3], repeat: 20}"
                )
            times = item["repeat"]
            if not _is_int(times) or not 0 <= times <= MAX_LAYERS:
                raise SpecError(
                    f"model.{key}: repeat item {item!r}: repeat must be an integer in "
                    f"0..{MAX_LAYERS}"
                )
            layers.extend([item["layer"]] * times)
        else:
            layers.append(item)
        if len(layers) > MAX_LAYERS:
            raise SpecError(f"model.{key}: more than {MAX_LAYERS} layers")
    if not layers:
        raise SpecError(f"model.{key}: the specification {value!r} has no layers")
    return tuple(_layer(item, key, i) for i, item in enumerate(layers))


def parse_attention(
    value: Any, num_layers: int, key: str = "decoder_attention"
) -> tuple[bool, ...]:
    """Read the decoder's attention specification: one bool per decoder layer.

    Args:
        value: a bool, a list of bools, or fairseq's string ("True", "[True, False]").
        num_layers: the number of decoder layers.
        key: the config key, named in error messages.

    Raises:
        SpecError: on a non-bool entry or a list whose length is not ``num_layers``.
    """
    value = plain(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            value = lowered == "true"
        else:
            value = _safe_literal(value, key)
    if isinstance(value, bool):
        return (value,) * num_layers
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, bool) for v in value):
        raise SpecError(
            f"model.{key}: expected a bool or a list of bools (one per decoder layer), "
            f"got {value!r}"
        )
    if len(value) != num_layers:
        raise SpecError(
            f"model.{key}: {len(value)} entries for {num_layers} decoder layers; give one "
            "bool per layer or a single bool"
        )
    return tuple(value)


def receptive_field(layers: Sequence[LayerSpec]) -> int:
    """Tokens one output position sees through the convolution stack: 1 + sum(k - 1)."""
    return 1 + sum(k - 1 for _, k, _ in layers)
