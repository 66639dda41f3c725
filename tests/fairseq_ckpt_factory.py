"""Test-only builders of fairseq-style fconv checkpoints, written from fairseq's layout alone.

Nothing here uses convseq: the state-dict keys, their order and shapes follow the list in
shared/reference/fairseq-fconv.md section 1.7 (fairseq/models/fconv.py), and the surrounding
dict follows fairseq's trainer (``args`` Namespace before 0.10; ``cfg`` as an OmegaConf
DictConfig in 0.10, as a plain container after it, with the model's Namespace inside).
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf, _utils

PAD = 1


def _extend(layers: Sequence[Sequence[int]]) -> list[tuple[int, int, int]]:
    """fairseq's extend_conv_spec: (C, k) -> (C, k, 1)."""
    return [tuple(x) if len(x) == 3 else (x[0], x[1], 1) for x in layers]


def _weight_normed(prefix: str, out: int, in_shape: tuple[int, ...], conv: bool) -> list:
    """bias, weight_g, weight_v of a weight-normed Linear (dim 0) or ConvTBC (dim 2)."""
    if conv:
        k, cin = in_shape
        return [
            (f"{prefix}.bias", (out,)),
            (f"{prefix}.weight_g", (1, 1, out)),
            (f"{prefix}.weight_v", (k, cin, out)),
        ]
    return [
        (f"{prefix}.bias", (out,)),
        (f"{prefix}.weight_g", (out, 1)),
        (f"{prefix}.weight_v", (out, in_shape[0])),
    ]


def _stack(prefix: str, embed: int, layers: list[tuple[int, int, int]]) -> tuple[list, list, int]:
    """(projection keys, convolution keys, last channels) of an encoder or decoder stack."""
    in_channels = layers[0][0]
    layer_in = [in_channels]
    projections, convolutions = [], []
    for i, (out, k, r) in enumerate(layers):
        residual_dim = out if r == 0 else layer_in[-r]
        if residual_dim != out:
            projections += _weight_normed(f"{prefix}.projections.{i}", out, (residual_dim,), False)
        convolutions += _weight_normed(
            f"{prefix}.convolutions.{i}", 2 * out, (k, in_channels), True
        )
        in_channels = out
        layer_in.append(out)
    return projections, convolutions, in_channels


def fconv_keys_and_shapes(
    *,
    src_vocab: int,
    tgt_vocab: int,
    encoder_embed_dim: int,
    encoder_layers: Sequence[Sequence[int]],
    decoder_embed_dim: int,
    decoder_layers: Sequence[Sequence[int]],
    decoder_out_embed_dim: int,
    attention: Sequence[bool],
    share_embed: bool = False,
    max_source_positions: int = 1024,
    max_target_positions: int = 1024,
    decoder_version: float | None = 2.0,
) -> list[tuple[str, tuple[int, ...]]]:
    """fairseq's fconv state-dict keys and shapes, in registration order.

    ``decoder_version`` < 2 gives the pre-2018 decoder convolutions (``weight_g`` (k, 1, 1));
    None also leaves out the ``decoder.version`` buffer, as files from 2017 do.
    """
    enc, dec = _extend(encoder_layers), _extend(decoder_layers)
    keys: list[tuple[str, tuple[int, ...]]] = [
        ("encoder.embed_tokens.weight", (src_vocab, encoder_embed_dim)),
        ("encoder.embed_positions.weight", (max_source_positions, encoder_embed_dim)),
    ]
    keys += _weight_normed("encoder.fc1", enc[0][0], (encoder_embed_dim,), False)
    projections, convolutions, last = _stack("encoder", encoder_embed_dim, enc)
    keys += projections + convolutions
    keys += _weight_normed("encoder.fc2", encoder_embed_dim, (last,), False)

    if decoder_version is not None:
        keys.append(("decoder.version", (1,)))
    keys += [
        ("decoder.embed_tokens.weight", (tgt_vocab, decoder_embed_dim)),
        ("decoder.embed_positions.weight", (max_target_positions, decoder_embed_dim)),
    ]
    keys += _weight_normed("decoder.fc1", dec[0][0], (decoder_embed_dim,), False)
    projections, convolutions, last = _stack("decoder", decoder_embed_dim, dec)
    if decoder_version is None or decoder_version < 2:
        convolutions = [
            (name, (shape_k_of(convolutions, name), 1, 1))
            if name.endswith("weight_g")
            else (name, s)
            for name, s in convolutions
        ]
    keys += projections + convolutions
    for i, (out, _, _) in enumerate(dec):
        if attention[i]:
            keys += _weight_normed(
                f"decoder.attention.{i}.in_projection", decoder_embed_dim, (out,), False
            )
            keys += _weight_normed(
                f"decoder.attention.{i}.out_projection", out, (decoder_embed_dim,), False
            )
    keys += _weight_normed("decoder.fc2", decoder_out_embed_dim, (last,), False)
    if share_embed:
        keys += [
            ("decoder.fc3.weight", (tgt_vocab, decoder_out_embed_dim)),
            ("decoder.fc3.bias", (tgt_vocab,)),
        ]
    else:
        keys += _weight_normed("decoder.fc3", tgt_vocab, (decoder_out_embed_dim,), False)
    return keys


def shape_k_of(keys: list[tuple[str, tuple[int, ...]]], g_name: str) -> int:
    """The kernel width k of the convolution whose weight_g is ``g_name`` (from its weight_v)."""
    v_name = g_name[: -len("weight_g")] + "weight_v"
    return dict(keys)[v_name][0]


def fconv_state_dict(
    keys: list[tuple[str, tuple[int, ...]]],
    values: Mapping[str, Any] | None = None,
    seed: int = 0,
    decoder_version: float | None = 2.0,
) -> OrderedDict[str, torch.Tensor]:
    """A state dict with those keys: given ``values`` where present, random numbers elsewhere.

    Random embeddings have a zero pad row; random gains are positive. A tied ``decoder.fc3.weight``
    is the same tensor as ``decoder.embed_tokens.weight``, as in fairseq.
    """
    values = dict(values or {})
    rng = np.random.default_rng(seed)
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for name, shape in keys:
        if name == "decoder.version":
            out[name] = torch.tensor([float(decoder_version)])
            continue
        if name == "decoder.fc3.weight" and "decoder.fc3.weight_v" not in dict(keys):
            out[name] = out["decoder.embed_tokens.weight"]
            continue
        if name in values:
            array = np.asarray(values.pop(name), dtype=np.float32)
            if array.shape != shape:
                raise ValueError(f"{name}: given shape {array.shape}, fairseq's is {shape}")
        elif name.endswith("weight_g"):
            array = rng.uniform(0.5, 1.5, size=shape)
        else:
            array = rng.normal(0.0, 0.5, size=shape)
            if "embed_" in name:
                array[PAD] = 0.0
        out[name] = torch.tensor(np.asarray(array, dtype=np.float32))
    if values:
        raise ValueError(f"values for keys fairseq does not have: {sorted(values)}")
    return out


# -- args / cfg as fairseq saved them -----------------------------------------------------------


def fairseq_namespace(
    model_fields: Mapping[str, Any],
    source_lang: str | None = "de",
    target_lang: str | None = "en",
    **extra: Any,
) -> argparse.Namespace:
    """A flat Namespace like fairseq-train's parser leaves it: training, task and model options."""
    fields: dict[str, Any] = {
        "no_progress_bar": False,
        "log_interval": 100,
        "seed": 1,
        "cpu": False,
        "fp16": False,
        "task": "translation",
        "data": "data-bin/iwslt14.tokenized.de-en",
        "source_lang": source_lang,
        "target_lang": target_lang,
        "left_pad_source": "True",
        "left_pad_target": "False",
        "max_source_positions": 1024,
        "max_target_positions": 1024,
        "upsample_primary": 1,
        "criterion": "label_smoothed_cross_entropy",
        "label_smoothing": 0.1,
        "optimizer": "nag",
        "lr": [0.25],
        "momentum": 0.99,
        "weight_decay": 0.0,
        "lr_scheduler": "fixed",
        "force_anneal": 200,
        "lr_shrink": 0.1,
        "clip_norm": 0.1,
        "max_tokens": 4000,
        "update_freq": [1],
        "save_dir": "checkpoints/fconv",
        "encoder_embed_path": None,
        "decoder_embed_path": None,
    }
    fields.update(model_fields)
    fields.update(extra)
    return argparse.Namespace(**fields)


def _set_object_value(cfg: Any, key: str, value: Any) -> None:
    """Store a Namespace inside a DictConfig, as fairseq does by disabling OmegaConf's type check."""
    name = (
        "is_primitive_type"
        if hasattr(_utils, "is_primitive_type")
        else "is_primitive_type_annotation"
    )
    original = getattr(_utils, name)
    setattr(_utils, name, lambda _: True)
    try:
        setattr(cfg, key, value)
    finally:
        setattr(_utils, name, original)


def fairseq_dictconfig(args: argparse.Namespace) -> Any:
    """``cfg`` as fairseq 0.10 pickles it: an untyped, struct-mode DictConfig.

    The model (an argparse model) is the flat Namespace with ``_name`` = the arch.
    """
    sections = {
        "_name": None,
        "common": {
            "_name": None,
            "seed": args.seed,
            "cpu": args.cpu,
            "fp16": args.fp16,
            "log_interval": args.log_interval,
            "user_dir": None,
        },
        "dataset": {
            "_name": None,
            "max_tokens": args.max_tokens,
            "batch_size": None,
            "num_workers": 1,
        },
        "optimization": {
            "_name": None,
            "max_epoch": 0,
            "lr": list(args.lr),
            "clip_norm": args.clip_norm,
            "update_freq": [1],
        },
        "checkpoint": {"_name": None, "save_dir": args.save_dir, "no_save_optimizer_state": False},
        "generation": {"_name": None, "beam": 5, "max_len_a": 0.0, "max_len_b": 200},
        "model": None,
        "task": {
            "_name": "translation",
            "data": args.data,
            "source_lang": args.source_lang,
            "target_lang": args.target_lang,
            "left_pad_source": True,
            "left_pad_target": False,
            "max_source_positions": args.max_source_positions,
            "max_target_positions": args.max_target_positions,
        },
        "criterion": {
            "_name": args.criterion,
            "label_smoothing": args.label_smoothing,
            "sentence_avg": False,
        },
        "optimizer": {
            "_name": "nag",
            "momentum": args.momentum,
            "weight_decay": 0.0,
            "lr": list(args.lr),
        },
        "lr_scheduler": {
            "_name": "fixed",
            "force_anneal": args.force_anneal,
            "lr_shrink": args.lr_shrink,
            "lr": list(args.lr),
        },
        "scoring": {"_name": "bleu", "pad": 1, "eos": 2, "unk": 3},
        "bpe": None,
        "tokenizer": None,
    }
    cfg = OmegaConf.create(sections)
    model = argparse.Namespace(**vars(args))
    model._name = args.arch
    _set_object_value(cfg, "model", model)
    OmegaConf.set_struct(cfg, True)
    return cfg


def fairseq_container(args: argparse.Namespace) -> dict[str, Any]:
    """``cfg`` as fairseq >= 0.10.2 pickles it: the DictConfig turned into plain containers."""
    return OmegaConf.to_container(fairseq_dictconfig(args), resolve=True, enum_to_str=True)


def write_checkpoint(
    path: Path,
    model: Mapping[str, torch.Tensor],
    *,
    args: argparse.Namespace | None = None,
    cfg: Any = None,
    numpy_metrics: bool = False,
    **top_level: Any,
) -> Path:
    """Pickle a checkpoint dict the way fairseq's trainer lays it out."""
    extra_state: dict[str, Any] = {
        "train_iterator": {"epoch": 31, "iterations_in_epoch": 0, "shuffle": True, "version": 2},
        "val_loss": 3.21,
        "best": 3.2,
        "previous_training_time": 5123.4,
    }
    if numpy_metrics:  # fairseq logs BLEU n-gram counts as NumPy arrays when --eval-bleu is on
        extra_state["metrics"] = OrderedDict(
            valid=[
                (
                    0,
                    "_bleu_counts",
                    "AverageMeter",
                    {
                        "val": np.array([12, 7, 4, 2]),
                        "sum": np.array([120, 70, 40, 20]),
                        "count": 10,
                        "round": None,
                    },
                )
            ],
            train=[
                (
                    0,
                    "loss",
                    "AverageMeter",
                    {"val": np.float64(4.5), "sum": 45.0, "count": 10, "round": 3},
                )
            ],
        )
    state: dict[str, Any] = {
        "args": args,
        "model": model,
        "optimizer_history": [
            {
                "criterion_name": "LabelSmoothedCrossEntropyCriterion",
                "optimizer_name": "FairseqNAG",
                "lr_scheduler_state": {"best": 3.2},
                "num_updates": 12345,
            }
        ],
        "extra_state": extra_state,
        "last_optimizer_state": {
            "state": {0: {"momentum_buffer": torch.zeros(3)}},
            "param_groups": [{"lr": 0.25, "momentum": 0.99, "weight_decay": 0.0, "params": [0]}],
        },
    }
    if cfg is not None:
        state["cfg"] = cfg
    state.update(top_level)
    torch.save(state, path)
    return path


def write_dict(path: Path, num_symbols: int, prefix: str = "w") -> Path:
    """A fairseq dict.txt whose dictionary has ``num_symbols`` entries (4 specials implied)."""
    lines = [f"{prefix}{i} {1000 - i}" for i in range(num_symbols - 4)]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_databin_files(
    folder: Path, src: str, tgt: str, splits: Sequence[str] = ("train", "valid", "test")
) -> list[Path]:
    """Empty ``<split>.<src>-<tgt>.<lang>.{idx,bin}`` files, named as fairseq-preprocess names them.

    Only the names matter to the readers of the language pair; the contents stay empty.
    """
    written = []
    for split in splits:
        for lang in (src, tgt):
            for ext in ("idx", "bin"):
                path = folder / f"{split}.{src}-{tgt}.{lang}.{ext}"
                path.write_bytes(b"")
                written.append(path)
    return written


# -- LightConv / DynamicConv (fairseq/models/lightconv.py, fairseq 0.12) --------------------------


def _lightconv_block(
    prefix: str, embed: int, conv: int, heads: int, kernel: int, conv_type: str, glu: bool
) -> list[tuple[str, tuple[int, ...]]]:
    """linear1, the convolution and linear2 of one LightConv layer, in fairseq's order."""
    keys = [(f"{prefix}.linear1.weight", (2 * conv if glu else conv, embed))]
    keys.append((f"{prefix}.linear1.bias", (2 * conv if glu else conv,)))
    if conv_type == "lightweight":  # LightweightConv1dTBC: one (1, K) kernel per head, no bias
        keys.append((f"{prefix}.conv.weight", (heads, 1, kernel)))
    else:  # DynamicConv1dTBC: conv_bias, then the kernel-predicting linear (no bias)
        keys.append((f"{prefix}.conv.conv_bias", (1, 1, conv)))
        keys.append((f"{prefix}.conv.weight_linear.weight", (heads * kernel, conv)))
    keys += [(f"{prefix}.linear2.weight", (embed, conv)), (f"{prefix}.linear2.bias", (embed,))]
    return keys


def _norm(prefix: str, dim: int) -> list[tuple[str, tuple[int, ...]]]:
    return [(f"{prefix}.weight", (dim,)), (f"{prefix}.bias", (dim,))]


def lightconv_keys_and_shapes(
    *,
    src_vocab: int,
    tgt_vocab: int,
    embed_dim: int,
    ffn_dim: int,
    heads: int,
    encoder_kernels: Sequence[int],
    decoder_kernels: Sequence[int],
    encoder_conv_type: str = "dynamic",
    decoder_conv_type: str = "dynamic",
    glu: bool = True,
    learned_pos: bool = False,
    max_positions: int = 1024,
    float_tensor: bool = False,
    embed_out: bool = False,
) -> list[tuple[str, tuple[int, ...]]]:
    """fairseq's LightConv state-dict keys and shapes (one width for every dim, post-norm).

    ``learned_pos``: learned position tables of max + pad + 1 rows. ``float_tensor``: the
    ``embed_positions._float_tensor`` buffer releases before 0.12 saved for sinusoidal
    positions. ``embed_out``: the untied output matrix under its name before
    ``output_projection`` existed.
    """
    keys: list[tuple[str, tuple[int, ...]]] = []
    for side, vocab, kernels, conv_type in (
        ("encoder", src_vocab, encoder_kernels, encoder_conv_type),
        ("decoder", tgt_vocab, decoder_kernels, decoder_conv_type),
    ):
        keys += [(f"{side}.version", (1,)), (f"{side}.embed_tokens.weight", (vocab, embed_dim))]
        if learned_pos:
            keys.append((f"{side}.embed_positions.weight", (max_positions + PAD + 1, embed_dim)))
        elif float_tensor:
            keys.append((f"{side}.embed_positions._float_tensor", (1,)))
        for i, k in enumerate(kernels):
            p = f"{side}.layers.{i}"
            keys += _lightconv_block(p, embed_dim, embed_dim, heads, k, conv_type, glu)
            if side == "encoder":
                keys += [(f"{p}.fc1.weight", (ffn_dim, embed_dim)), (f"{p}.fc1.bias", (ffn_dim,))]
                keys += [(f"{p}.fc2.weight", (embed_dim, ffn_dim)), (f"{p}.fc2.bias", (embed_dim,))]
                keys += _norm(f"{p}.layer_norm1", embed_dim) + _norm(f"{p}.layer_norm2", embed_dim)
                continue
            keys += _norm(f"{p}.conv_layer_norm", embed_dim)
            for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
                keys += [
                    (f"{p}.encoder_attn.{proj}.weight", (embed_dim, embed_dim)),
                    (f"{p}.encoder_attn.{proj}.bias", (embed_dim,)),
                ]
            keys += _norm(f"{p}.encoder_attn_layer_norm", embed_dim)
            keys += [(f"{p}.fc1.weight", (ffn_dim, embed_dim)), (f"{p}.fc1.bias", (ffn_dim,))]
            keys += [(f"{p}.fc2.weight", (embed_dim, ffn_dim)), (f"{p}.fc2.bias", (embed_dim,))]
            keys += _norm(f"{p}.final_layer_norm", embed_dim)
    name = "decoder.embed_out" if embed_out else "decoder.output_projection.weight"
    keys.append((name, (tgt_vocab, embed_dim)))
    return keys


def lightconv_state_dict(
    keys: list[tuple[str, tuple[int, ...]]], seed: int = 0
) -> OrderedDict[str, torch.Tensor]:
    """Random values for those keys: version buffers 2, embeddings with a zero pad row, layer
    norms' gains near 1, an empty ``_float_tensor``-like buffer of one element."""
    rng = np.random.default_rng(seed)
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for name, shape in keys:
        if name.endswith(".version"):
            array = np.array([2.0])
        elif "norm" in name and name.endswith(".weight"):
            array = rng.uniform(0.5, 1.5, size=shape)
        else:
            array = rng.normal(0.0, 0.3, size=shape)
            if "embed_tokens" in name or "embed_positions.weight" in name:
                array[PAD] = 0.0
        out[name] = torch.tensor(np.asarray(array, dtype=np.float32))
    return out
