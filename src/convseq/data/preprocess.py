"""Preprocessing: parallel text -> a checked, segmented, binarised data-bin in a shared cache.

`prepare_databin` is the entry point. The data-bin folder is named after a key, the hash of the
input files' sha256 checksums and of every setting that changes its content, so runs with the
same inputs and settings share one, and a changed input or setting gets a new one.

Concurrency and crashes: a build runs under a file lock (one builder per key; the others wait
and then reuse its result) in a hidden temporary folder that is renamed into place only when
complete. A folder under the final name therefore always holds a finished data-bin; leftovers of
a killed build are hidden temporaries, removed by the next builder. What goes into the folder is
built by `convseq.data.binarize`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

from filelock import FileLock, Timeout
from omegaconf import DictConfig

from convseq.common.config import typed
from convseq.data.binarize import (
    build_databin,
    content_settings,
    input_id,
    split_inputs,
    split_roles,
)
from convseq.data.config import DataConfig
from convseq.data.corpus_dir import with_corpus_dir
from convseq.data.databin import META_FILE, SPLITS, DataBin
from convseq.data.encode import WORKER_ENV
from convseq.data.fairseq_databin import FairseqDataBin
from convseq.data.subword import SUBWORD_TYPES, check_remove_bpe
from convseq.data.summary import format_summary
from convseq.data.textio import PairFilter, file_sha256_and_newlines
from convseq.data.vocab import given_checksums
from convseq.errors import DataError

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"[A-Za-z0-9_.+-]+")
DATA_FORMATS = ("convseq", "fairseq")  # data.format: convseq's own data-bin | fairseq-preprocess's


# -- configuration -------------------------------------------------------------------------------
def as_data_config(data_cfg: DataConfig | DictConfig | Mapping) -> DataConfig:
    """`data_cfg` as a checked DataConfig: an instance as it is (a new one only where
    `remove_bpe` is written another way), a DictConfig or a plain mapping typed first.

    Raises:
        DataError: an unknown key, a value of the wrong type or one convseq cannot use, named.
    """
    cfg = typed(DataConfig, data_cfg, "data", DataError)
    _check_corpus(cfg)
    _check_settings(cfg)
    remove_bpe = check_remove_bpe(cfg.remove_bpe)
    return cfg if remove_bpe == cfg.remove_bpe else dataclasses.replace(cfg, remove_bpe=remove_bpe)


def _check_corpus(cfg: DataConfig) -> None:
    """The format, the languages, the fairseq folder and the extra test sets."""
    if cfg.format not in DATA_FORMATS:
        raise DataError(f"data.format must be one of {DATA_FORMATS}, got {cfg.format!r}")
    fairseq = cfg.format == "fairseq"
    for key in ("name", "src_lang", "tgt_lang"):
        value = getattr(cfg, key)
        if value is None and key != "name" and not fairseq:
            raise DataError(
                f"data.{key} is null: give the file suffix of that side (null is for "
                "data.format=fairseq only, which reads the pair from the file names)"
            )
        if value is not None and not _NAME_RE.fullmatch(value):
            raise DataError(f"data.{key}={value!r}: use letters, digits and _ . + - only")
    if fairseq and not cfg.path:
        raise DataError(
            "data.format=fairseq reads a folder written by fairseq-preprocess: give it with "
            "data.path=DIR"
        )
    if cfg.src_lang is not None and cfg.src_lang == cfg.tgt_lang:
        raise DataError(
            f"data.src_lang and data.tgt_lang are both {cfg.src_lang!r}; they must differ"
        )
    for name, prefix in cfg.test_sets.items():
        if name in SPLITS or not _NAME_RE.fullmatch(name):
            raise DataError(
                f"data.test_sets.{name}: a test set's name must differ from {SPLITS} and use "
                "letters, digits and _ . + - only"
            )
        if not prefix or "/" in prefix or "\\" in prefix:
            raise DataError(
                f"data.test_sets.{name}={prefix!r}: give the input file prefix inside data.dir "
                f"(the files are <data.dir>/<prefix>.{cfg.src_lang} and .{cfg.tgt_lang})"
            )


def _check_settings(cfg: DataConfig) -> None:
    """Subwords, the generator, the workers and the length and filter settings."""
    if cfg.subword.type not in SUBWORD_TYPES:
        raise DataError(
            f"data.subword.type must be one of {SUBWORD_TYPES}, got {cfg.subword.type!r}"
        )
    if cfg.generator not in (None, "toy"):
        raise DataError(f"data.generator must be null or 'toy', got {cfg.generator!r}")
    if cfg.workers < 1:
        raise DataError(f"data.workers must be >= 1, got {cfg.workers}")
    if cfg.subword.input_sentence_size < 0:
        raise DataError(
            f"data.subword.input_sentence_size must be >= 0, got {cfg.subword.input_sentence_size}"
        )
    # PairFilter checks train_invalid, eval_overlong, max_positions and the regex.
    PairFilter(True, cfg.max_positions, cfg.train_invalid, cfg.eval_overlong, cfg.drop_train_regex)


def databin_key(
    cfg: DataConfig, checksums: Mapping[str, str], train_lines: Mapping[str, int] | None = None
) -> str:
    """Hex sha256 of the content settings and the input checksums (`{split}.{lang}` -> sha256).

    `train_lines` bounds the train files' line counts per side (see `content_settings`).
    """
    blob = json.dumps(
        {"settings": content_settings(cfg, train_lines), "inputs": dict(checksums)},
        sort_keys=True,
    )
    return _sha256_text(blob)


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def input_paths(cfg: DataConfig) -> dict[tuple[str, str], Path]:
    """`(split role, side)` -> input file `{dir}/{split name}.{lang}` (extra test sets too)."""
    corpus = Path(cfg.dir).expanduser().absolute()
    names = split_inputs(cfg)
    langs = {"src": cfg.src_lang, "tgt": cfg.tgt_lang}
    return {
        (role, side): corpus / f"{names[role]}.{langs[side]}"
        for role in split_roles(cfg)
        for side in langs
    }


# -- entry points ----------------------------------------------------------------------------------
def prepare_databin(
    data_cfg: DataConfig | DictConfig | Mapping, cache_dir: str, progress: bool = True
) -> Path:
    """Build (or reuse) the data-bin of a corpus; return its folder.

    The folder is `{cache_dir}/databin/{name}-{src}-{tgt}-{key12}`. Safe to call from many
    processes at once: one builds, the others wait and reuse.

    Args:
        data_cfg: the `data` config group (DataConfig, DictConfig or dict with its keys).
        cache_dir: root of the shared cache.
        progress: show progress bars on large inputs.

    Raises:
        DataError: a missing, malformed or inconsistent input, or an invalid setting.
    """
    cfg = as_data_config(data_cfg)
    if cfg.format == "fairseq":  # read as it is: nothing to build, only files to check
        databin = FairseqDataBin.from_config(cfg)
        databin.check()
        if progress:
            print(databin.summary(), flush=True)
        return databin.path
    return ensure_databin(cfg, cache_dir, progress)[0]


def open_databin(
    data_cfg: DataConfig | DictConfig | Mapping, cache_dir: str, progress: bool = True
) -> DataBin | FairseqDataBin:
    """The data-bin of a data config, ready to read: convseq's own (built or reused by
    `prepare_databin`) or, with `data.format=fairseq`, fairseq-preprocess's folder, checked."""
    cfg = as_data_config(data_cfg)
    if cfg.format == "fairseq":
        databin = FairseqDataBin.from_config(cfg)
        databin.check()
        return databin
    return DataBin(prepare_databin(cfg, cache_dir, progress))


def ensure_databin(
    data_cfg: DataConfig | DictConfig | Mapping, cache_dir: str, progress: bool = True
) -> tuple[Path, bool]:
    """Like `prepare_databin`, but also says whether this call built the data-bin."""
    if os.environ.get(WORKER_ENV) == str(os.getppid()):  # a worker of a build in its parent
        raise DataError(
            "preprocessing started inside one of its own worker processes: the script that runs "
            "it with data.workers > 1 is imported again by each worker, so keep its code under "
            "`if __name__ == '__main__':`"
        )
    cfg, paths, checksums, key, final = _locate(data_cfg, cache_dir)
    root = final.parent
    if _usable(final, key):
        log.info("reusing data-bin %s", final)
        return final, False

    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root / f".{final.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"waiting for another process to finish building {final} ...", flush=True)
        lock.acquire()
    try:
        if _usable(final, key):  # another process built it while we waited
            return final, False
        _clear_leftovers(root, final)
        tmp = root / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            meta = build_databin(cfg, paths, checksums, key, tmp, progress)
            os.rename(tmp, final)  # atomic: the final name appears only when complete
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            # Another machine finished first (file locks may not reach across a network file
            # system, but the rename is still atomic): use its data-bin.
            if _usable(final, key):
                return final, False
            raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        lock.release()
    print(format_summary(final, meta), flush=True)
    return final, True


def databin_path(data_cfg: DataConfig | DictConfig | Mapping, cache_dir: str) -> Path:
    """Where `prepare_databin` puts (or finds) this corpus's data-bin; builds nothing.

    Runs the corpus generator when `dir` is unset (`convseq.data.corpus_dir`): the key hashes
    the input files.
    """
    return _locate(data_cfg, cache_dir)[4]


def _locate(data_cfg, cache_dir: str):
    """The validated config, input paths, their checksums, the key and the data-bin folder."""
    # a given dir is read as it is; unset, the generator writes into its own folder in the cache
    cfg = with_corpus_dir(as_data_config(data_cfg), cache_dir)
    paths = input_paths(cfg)
    checksums, train_lines = {}, {}
    for (role, side), p in paths.items():
        checksums[input_id(cfg, role, side)], newlines = file_sha256_and_newlines(p)
        if role == "train":
            train_lines[side] = newlines + 1  # a last line without \n counts too
    checksums.update(given_checksums(cfg))  # given dictionaries are inputs too (none: no entry)
    key = databin_key(cfg, checksums, train_lines)
    root = Path(cache_dir).expanduser().absolute() / "databin"
    final = root / f"{cfg.name}-{cfg.src_lang}-{cfg.tgt_lang}-{key[:12]}"
    return cfg, paths, checksums, key, final


def _usable(path: Path, key: str) -> bool:
    """True when `path` is a finished data-bin of `key` whose arrays match its meta.json."""
    if not (path / META_FILE).is_file():
        return False
    try:
        db = DataBin(path)
        db.check()
        return db.meta.get("key") == key
    except (DataError, KeyError, TypeError):
        return False


def _clear_leftovers(root: Path, final: Path) -> None:
    """Remove temporaries of crashed builds and a damaged folder under the final name.

    Called with the lock held, so no temporary of this key belongs to a live build.
    """
    for tmp in root.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)
    if final.exists():
        print(f"discarding damaged or incomplete data-bin {final}", flush=True)
        aside = root / f".{final.name}.tmp-discard-{uuid.uuid4().hex[:8]}"
        os.rename(final, aside)
        shutil.rmtree(aside, ignore_errors=True)
