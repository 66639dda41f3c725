"""A data-bin's dictionaries: built from the kept train tokens, or given as fairseq dict files.

`data.src_dict` / `data.tgt_dict` (fairseq-preprocess's `--srcdict` / `--tgtdict`) name fairseq
`dict.<lang>.txt` files. A given dictionary is used exactly as written, as fairseq-preprocess
does: the four specials first, then its symbols in file order with their counts, and neither
`data.vocab.threshold`, `nwords` nor `padding_factor` applied; a word it lacks becomes `<unk>`.
With `data.vocab.joined=true` one given dictionary serves both sides (fairseq's
`--joined-dictionary --srcdict`). Each given file's sha256 is part of the data-bin key, so a
different dictionary makes a different data-bin, and a corpus without one keeps its key.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from convseq.data.config import DataConfig
from convseq.data.dictionary import Dictionary
from convseq.data.encode import SymbolTable
from convseq.data.textio import file_sha256
from convseq.errors import DataError

SIDES = ("src", "tgt")


def checksum_id(side: str) -> str:
    """The name of a given dictionary among the data-bin key's inputs (no dot: no input's name)."""
    return f"{side}_dict"


def given_paths(cfg: DataConfig) -> dict[str, Path]:
    """Side -> the given dictionary file of that side (both sides share one when joined).

    Raises:
        DataError: joined dictionaries with two different files given.
    """
    named = {side: getattr(cfg, checksum_id(side)) for side in SIDES}
    paths = {side: Path(p).expanduser().absolute() for side, p in named.items() if p}
    if not cfg.vocab.joined or not paths:
        return paths
    if len({p.resolve() for p in paths.values()}) > 1:
        raise DataError(
            f"data.vocab.joined=true uses one dictionary for both sides, but data.src_dict="
            f"{named['src']} and data.tgt_dict={named['tgt']} name different files: give only "
            "data.src_dict, or set data.vocab.joined=false to use one per side"
        )
    one = next(iter(paths.values()))
    return {side: one for side in SIDES}


def with_absolute_dict_paths(cfg: DataConfig) -> DataConfig:
    """`cfg` with its given dictionaries as absolute paths, as `data.dir` is: what a run
    records, so that a checkpoint's data settings still name the files from another folder."""
    absolute = {
        key: str(Path(path).expanduser().absolute())
        for key, path in ((checksum_id(side), getattr(cfg, checksum_id(side))) for side in SIDES)
        if path
    }
    return dataclasses.replace(cfg, **absolute) if absolute else cfg


def given_checksums(cfg: DataConfig) -> dict[str, str]:
    """`{side}_dict` -> sha256 of each given dictionary file (empty when none is given).

    Raises:
        DataError: a given file that does not exist, naming its key.
    """
    sums = {}
    for side, path in given_paths(cfg).items():
        if not path.is_file():
            what = "is a folder, not a file" if path.is_dir() else "not found"
            raise DataError(
                f"data.{checksum_id(side)}: dictionary file {what}; give the path of a fairseq "
                "dict.<lang>.txt (relative paths start from the current folder)",
                path=str(path),
            )
        sums[checksum_id(side)] = file_sha256(path)
    return sums


def load_given(cfg: DataConfig, checksums: dict[str, str]) -> dict[str, Dictionary]:
    """Side -> the given dictionary, read as written (a joined one is the same object twice).

    Raises:
        DataError: a malformed file (with its line), or one that changed since the key was made.
    """
    loaded: dict[Path, Dictionary] = {}
    given = {}
    for side, path in given_paths(cfg).items():
        if path not in loaded:
            loaded[path] = Dictionary.load(path)
            if file_sha256(path) != checksums[checksum_id(side)]:
                raise DataError("file changed while preprocessing; run again", path=str(path))
        given[side] = loaded[path]
    return given


def build_dictionaries(
    cfg: DataConfig,
    src_table: SymbolTable,
    tgt_table: SymbolTable,
    given: dict[str, Dictionary],
) -> tuple[Dictionary, Dictionary]:
    """The (source, target) dictionaries: the given ones, the rest from the train counts.

    Without a given one, a joined dictionary counts both sides and a per-side one its own side,
    then is finalised with `data.vocab` (sort, threshold, nwords, padding).
    """
    v = cfg.vocab

    def build(*counts: dict[str, int]) -> Dictionary:
        d = Dictionary()
        total: Counter = Counter()
        for c in counts:
            total.update(c)
        d.add_counts(total)
        d.finalize(threshold=v.threshold, nwords=v.nwords, padding_factor=v.padding_factor)
        return d

    if v.joined:
        if given:  # given_paths gave both sides the same file
            return given["src"], given["tgt"]
        d = build(src_table.counted(), tgt_table.counted())
        return d, d
    src = given["src"] if "src" in given else build(src_table.counted())
    tgt = given["tgt"] if "tgt" in given else build(tgt_table.counted())
    return src, tgt


def vocab_meta(
    cfg: DataConfig, dicts: tuple[Dictionary, Dictionary], checksums: dict[str, str]
) -> dict:
    """meta.json's `vocab` entry: the settings, the sizes and (only when any) the given files."""
    meta = {**asdict(cfg.vocab), "src_size": len(dicts[0]), "tgt_size": len(dicts[1])}
    paths = given_paths(cfg)
    if paths:  # only then: a data-bin without given dictionaries keeps its bytes
        meta["given"] = {
            side: {"path": str(path), "sha256": checksums[checksum_id(side)]}
            for side, path in paths.items()
        }
    return meta
