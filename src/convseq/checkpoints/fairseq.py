"""Load a fairseq translation checkpoint (fconv or LightConv) as a convseq model, and write a
convseq model as one.

What differs between the families (their arguments, defaults and state-dict layouts) is each
one's `FairseqAdapter` (`convseq.checkpoints.fairseq_adapters`), chosen by the architecture a
file names or by the family a model's config names; the steps here are the same for all.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from convseq.checkpoints.fairseq_adapters import adapter_for_arch, adapter_for_config
from convseq.checkpoints.fairseq_args import arch_of, fairseq_args, fairseq_cfg, language_pair
from convseq.checkpoints.safe_load import read_checkpoint, to_plain
from convseq.checkpoints.state_dict import check_vocabularies, describe_load_error
from convseq.data.dictionary import Dictionary
from convseq.errors import CheckpointError, DataError
from convseq.models.family import ModelConfig, build_model, model_config

_LANG = re.compile(r"^[\w.\-]+$")  # fairseq puts the code in file names: dict.<lang>.txt


def _dict_path(folder: Path, lang: str) -> Path:
    return folder / f"dict.{lang}.txt"


def databin_language_pairs(folder: Path) -> list[tuple[str, str]]:
    """The (source, target) pairs that a fairseq data-bin's file names give, sorted.

    fairseq-preprocess names its files ``<split>.<src>-<tgt>.<lang>.{idx,bin}`` (e.g.
    ``train.de-en.de.bin``), and fairseq's translation task reads the pair from these names when
    the languages are not given (``infer_language_pair``). A name counts when its language is
    one of the pair's; codes cannot hold '-' or '.', as in fairseq.
    """
    if not folder.is_dir():
        return []
    pairs = set()
    for path in folder.iterdir():
        parts = path.name.split(".")
        if len(parts) < 4 or parts[-1] not in ("idx", "bin") or not all(parts):
            continue
        langs = parts[-3].split("-")
        if len(langs) == 2 and all(_LANG.match(x) for x in langs) and parts[-2] in langs:
            pairs.add((langs[0], langs[1]))
    return sorted(pairs)


def _pair_from_databin(folder: Path, checkpoint: Path) -> tuple[str, str] | None:
    """The one language pair the folder's data-bin files name; None when they name none."""
    pairs = databin_language_pairs(folder)
    if len(pairs) > 1:
        named = ", ".join(f"{s}-{t}" for s, t in pairs)
        raise CheckpointError(
            f"{checkpoint}: the checkpoint does not name its language pair, and the data-bin "
            f"files in {folder} name several ({named}); pass source_lang= and target_lang=, or "
            "a dict_dir (task=generate: gen.dict_dir) whose .idx/.bin files name one pair"
        )
    return pairs[0] if pairs else None


def _guess_languages(
    folder: Path, model_sd: Mapping[str, torch.Tensor], checkpoint: Path
) -> tuple[str, str]:
    """Pick (source, target) among the folder's dict.*.txt files by their sizes.

    Used only when the checkpoint does not name its language pair.
    """
    found = sorted(folder.glob("dict.*.txt"))
    langs = [p.name[len("dict.") : -len(".txt")] for p in found]
    src_rows = int(model_sd["encoder.embed_tokens.weight"].shape[0])
    tgt_rows = int(model_sd["decoder.embed_tokens.weight"].shape[0])
    sizes = {}
    for lang, path in zip(langs, found):
        try:
            sizes[lang] = len(Dictionary.load(path))
        except DataError:
            continue
    pairs = [
        (s, t)
        for s in sizes
        for t in sizes
        if s != t and sizes[s] == src_rows and sizes[t] == tgt_rows
    ]
    if len(pairs) == 1:
        return pairs[0]
    raise CheckpointError(
        f"{checkpoint}: the checkpoint does not name its language pair, and the dictionaries "
        f"in {folder} ({', '.join(p.name for p in found) or 'none'}) do not identify it "
        f"(need one of {src_rows} and one of {tgt_rows} symbols), and no data-bin file there "
        "names it (<split>.<src>-<tgt>.<lang>.idx/.bin); pass source_lang= and target_lang=, or "
        "a dict_dir (task=generate: gen.dict_dir) holding the data-bin"
    )


def load_fairseq(
    checkpoint_path: str | os.PathLike,
    dict_dir: str | os.PathLike | None = None,
    *,
    source_lang: str | None = None,
    target_lang: str | None = None,
) -> tuple[nn.Module, Dictionary, Dictionary]:
    """Build a convseq model from a fairseq fconv or LightConv translation checkpoint.

    The checkpoint is read with ``torch.load(weights_only=True)`` and an allowlist of exactly
    the globals fairseq writes (see `convseq.checkpoints.safe_load`); nothing in it is executed.
    Both the ``args`` (Namespace) and the ``cfg`` (OmegaConf or plain) forms are read; the
    architecture the file names picks the family (its `FairseqAdapter`), whose upgrade brings
    older layouts to the current one (fconv: the pre-2018 per-tap weight norm; LightConv: the
    sinusoidal positions' buffers of releases before 0.12).

    Args:
        checkpoint_path: fairseq's ``checkpoint_best.pt`` / ``model.pt``.
        dict_dir: the folder holding ``dict.<src>.txt`` and ``dict.<tgt>.txt``; default: the
            checkpoint's folder (where fairseq's released models keep them).
        source_lang, target_lang: override the language pair the checkpoint names. When
            neither names it, the pair comes from the dictionary folder's data-bin file names
            (``train.de-en.de.bin``: de->en, as fairseq reads it), else from which
            ``dict.*.txt`` sizes fit the embeddings.

    Returns:
        (model in eval mode, source dictionary, target dictionary).

    Raises:
        CheckpointError: the file is unreadable, refused, not a translation model of an
            architecture convseq reads, its state does not fit the model its arguments
            describe (the keys named), its dictionaries are missing or do not fit.
    """
    path = Path(checkpoint_path)
    plain, model_sd = _read_fairseq_state(path)
    try:
        adapter = adapter_for_arch(arch_of(plain))
        cfg = adapter.config(plain, model_sd)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        if key not in model_sd:
            raise CheckpointError(f"{path}: the model state has no {key}")
    folder = Path(dict_dir) if dict_dir is not None else path.parent
    src, tgt = _resolve_language_pair(plain, model_sd, folder, path, source_lang, target_lang)
    src_dict, tgt_dict = _load_dictionaries(folder, src, tgt, path)
    check_vocabularies(
        model_sd,
        len(src_dict),
        len(tgt_dict),
        _dict_path(folder, src),
        _dict_path(folder, tgt),
        path,
    )
    model = _build_model(cfg, adapter.upgrade(model_sd, cfg, path), src_dict, tgt_dict, path)
    model.eval()
    return model, src_dict, tgt_dict


def _read_fairseq_state(path: Path) -> tuple[dict[str, Any], Mapping[str, torch.Tensor]]:
    """Step 1 of loading: read the file; its entries (args/cfg made plain) and model state."""
    state = read_checkpoint(path)
    model_sd = state.get("model")
    if not isinstance(model_sd, Mapping) or not all(
        isinstance(v, torch.Tensor) for v in model_sd.values()
    ):
        raise CheckpointError(
            f"{path}: no 'model' state dict of tensors (top-level keys: {sorted(state)})"
        )
    # args and cfg made plain (OmegaConf records -> dicts); other entries as they are
    plain = {k: to_plain(v) if k in ("args", "cfg") else v for k, v in state.items()}
    return plain, model_sd


def _resolve_language_pair(
    plain: Mapping[str, Any],
    model_sd: Mapping[str, torch.Tensor],
    folder: Path,
    path: Path,
    source_lang: str | None,
    target_lang: str | None,
) -> tuple[str, str]:
    """Step 3 of loading: (source, target) from the arguments, the checkpoint or the folder."""
    src, tgt = language_pair(plain)
    src, tgt = source_lang or src, target_lang or tgt
    if src is None or tgt is None:
        # as fairseq's translation task: the data-bin's file names, then (convseq) the sizes
        found = _pair_from_databin(folder, path)
        if found is not None:
            src, tgt = src or found[0], tgt or found[1]
    if src is None or tgt is None:
        src, tgt = _guess_languages(folder, model_sd, path)
    return src, tgt


def _load_dictionaries(
    folder: Path, src: str, tgt: str, path: Path
) -> tuple[Dictionary, Dictionary]:
    """Step 4 of loading: read dict.<src>.txt and dict.<tgt>.txt from the folder."""
    dicts = []
    for role, lang in (("source", src), ("target", tgt)):
        if not isinstance(lang, str) or not _LANG.match(lang):
            raise CheckpointError(
                f"{path}: {role} language {lang!r} is not a language code (letters, digits, "
                "'_', '-', '.'); pass source_lang= and target_lang="
            )
        dict_path = _dict_path(folder, lang)
        if not dict_path.is_file():
            present = sorted(p.name for p in folder.glob("dict.*.txt")) if folder.is_dir() else []
            raise CheckpointError(
                f"{path}: {role} dictionary not found: looked for {dict_path} (language pair "
                f"{src}->{tgt}); found {present or 'no dict.*.txt files'} there. Pass "
                "dict_dir= the folder with the model's dict files, or source_lang=/target_lang="
            )
        try:
            dicts.append(Dictionary.load(dict_path))
        except DataError as e:
            raise CheckpointError(f"{path}: cannot read the {role} dictionary: {e}") from None
    return dicts[0], dicts[1]


def _build_model(
    cfg: ModelConfig,
    model_sd: Mapping[str, torch.Tensor],
    src_dict: Dictionary,
    tgt_dict: Dictionary,
    path: Path,
) -> nn.Module:
    """Step 5 of loading: build the model and load the (upgraded) state, which must fit exactly."""
    try:
        model = build_model(cfg, len(src_dict), len(tgt_dict), padding_idx=src_dict.pad())
    except ValueError as e:  # e.g. tied embeddings over dictionaries of different sizes
        raise CheckpointError(f"{path}: cannot build the {cfg.arch} model: {e}") from None
    own = model.state_dict()
    mismatched = [
        f"{k}: file {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in model_sd.items()
        if k in own and tuple(v.shape) != tuple(own[k].shape)
    ]
    missing = [k for k in own if k not in model_sd]
    unexpected = [k for k in model_sd if k not in own]
    if missing or unexpected or mismatched:
        raise CheckpointError(
            f"{path}: " + describe_load_error(missing, unexpected, mismatched, cfg.arch)
        )
    model.load_state_dict(model_sd, strict=True)
    return model


def _cpu_copy(state_dict: Mapping[str, torch.Tensor]) -> OrderedDict[str, torch.Tensor]:
    """Detached CPU copies; tensors that share storage (tied embeddings) stay shared."""
    copies: dict[tuple, torch.Tensor] = {}
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for key, tensor in state_dict.items():
        ident = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if ident not in copies:
            copies[ident] = tensor.detach().to("cpu", copy=True).contiguous()
        out[key] = copies[ident]
    return out


def save_fairseq(
    model: nn.Module,
    path: str | os.PathLike,
    src_dict: Dictionary,
    tgt_dict: Dictionary,
    src_lang: str = "src",
    tgt_lang: str = "tgt",
    args_style: str = "args",
) -> Path:
    """Write a convseq model (fconv or LightConv) as a fairseq checkpoint, with its dict.txt
    files beside it.

    The file holds what fairseq's ``load_checkpoint_to_cpu`` / ``load_model_ensemble`` read:
    the model arguments, ``model``, a one-entry ``optimizer_history`` and an ``extra_state``
    with a training-iterator position; no optimizer state (as with --no-save-optimizer-state).

    Args:
        model: the model; its ``cfg`` supplies the arguments, its family's `FairseqAdapter`
            writes them.
        path: the checkpoint file to write (atomically); dict.<lang>.txt go beside it.
        src_dict, tgt_dict: the model's dictionaries.
        src_lang, tgt_lang: language codes, used in the dict file names.
        args_style: "args" writes a flat ``args`` Namespace, read by every fairseq release
            (0.x before 0.10 need it; later ones rebuild a complete cfg from it); "cfg" writes
            the plain ``cfg`` container fairseq >= 0.10.2 writes itself.

    Returns:
        The checkpoint's path.
    """
    _check_save_arguments(src_dict, tgt_dict, src_lang, tgt_lang, args_style)
    if getattr(model, "cfg", None) is None:
        raise ValueError("the model has no cfg (its family's config); build it with build_model")
    cfg = model_config(model.cfg)
    adapter = adapter_for_config(cfg)
    path = Path(path)
    if src_dict.pad() != tgt_dict.pad():
        raise ValueError("the two dictionaries must share the pad index, as fairseq requires")
    if adapter.joined_dictionary(cfg) and src_dict != tgt_dict:
        raise ValueError(
            f"{cfg.arch} shares all embeddings: fairseq needs one dictionary for both sides"
        )
    model_sd = _cpu_copy(model.state_dict())
    check_vocabularies(
        model_sd,
        len(src_dict),
        len(tgt_dict),
        Path(f"<source dictionary {src_lang}>"),
        Path(f"<target dictionary {tgt_lang}>"),
        path,
    )
    data = str(path.resolve().parent)  # fairseq's task reads the dictionaries from here
    args = adapter.model_args(cfg)
    state = _checkpoint_state(args, model_sd, src_lang, tgt_lang, data, args_style)
    _write_checkpoint(state, path, src_dict, tgt_dict, src_lang, tgt_lang)
    return path


def _check_save_arguments(
    src_dict: Dictionary, tgt_dict: Dictionary, src_lang: str, tgt_lang: str, args_style: str
) -> None:
    """Step 1 of saving: refuse an unknown args_style and language codes fairseq cannot use."""
    if args_style not in ("args", "cfg"):
        raise ValueError(f"args_style must be 'args' or 'cfg', got {args_style!r}")
    for lang in (src_lang, tgt_lang):
        if not _LANG.match(lang):
            raise ValueError(f"language code {lang!r}: use letters, digits, '_', '-' or '.'")
    if src_lang == tgt_lang and src_dict != tgt_dict:
        raise ValueError(
            f"src_lang and tgt_lang are both {src_lang!r} but the dictionaries differ; "
            "they would be written to the same dict file"
        )


def _checkpoint_state(
    args: Mapping[str, Any],
    model_sd: Mapping[str, torch.Tensor],
    src_lang: str,
    tgt_lang: str,
    data: str,
    args_style: str,
) -> dict[str, Any]:
    """Step 2 of saving: the checkpoint's entries, in the order fairseq writes them."""
    state: dict[str, Any] = {}
    if args_style == "args":
        state["args"] = fairseq_args(args, src_lang, tgt_lang, data)
    else:
        state["args"] = None
        state["cfg"] = fairseq_cfg(args, src_lang, tgt_lang, data)
    state["model"] = model_sd
    state["optimizer_history"] = [
        {
            "criterion_name": "CrossEntropyCriterion",
            "optimizer_name": "FairseqNAG",
            "lr_scheduler_state": {},
            "num_updates": 0,
        }
    ]
    state["extra_state"] = {
        "train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "shuffle": True, "version": 2},
        "val_loss": None,
    }
    return state


def _write_checkpoint(
    state: Mapping[str, Any],
    path: Path,
    src_dict: Dictionary,
    tgt_dict: Dictionary,
    src_lang: str,
    tgt_lang: str,
) -> None:
    """Step 3 of saving: the dict.<lang>.txt files, then the checkpoint file, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src_dict.save(_dict_path(path.parent, src_lang))
    tgt_dict.save(_dict_path(path.parent, tgt_lang))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)  # readers see the old file or the complete new one, never half
    finally:
        tmp.unlink(missing_ok=True)
