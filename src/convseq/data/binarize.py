"""Building a data-bin's content: check the text, segment, build dictionaries, binarise.

`build_databin` writes every file of a data-bin into a folder and returns meta.json's dict; the
caching, locking and atomic renaming around it are in `convseq.data.preprocess`.

The text is streamed, so memory does not grow with the corpus (beyond the dictionaries, one flag
byte per input line, and blocks of a few MiB):

1. every input file is read block by block and checked (UTF-8, stray carriage returns, line
   counts of the two sides; a file without text is refused), then the train pairs are filtered
   (`drop_train_regex`, empty lines), and a split with no pair left is refused
   (`convseq.data.split_checks`);
2. sentencepiece, when asked for, is trained on the kept train sentences as a stream (on a seeded
   sample of `data.subword.input_sentence_size` of them when there are more;
   `convseq.data.subword_training`);
3. every kept pair is segmented, by `data.workers` processes (`convseq.data.encode`), over-long
   pairs are dropped, train tokens are counted, and each side's provisional ids are spooled to
   disk (`convseq.data.spool`); the valid/test reference text is written on the way;
4. the dictionaries are built from the counts or read as given (`convseq.data.vocab`), and each
   side is streamed from the spool through a lookup table into its token and offset arrays.

Blocks are processed and written in input order whatever the number of workers, so the bytes of
a data-bin depend only on its inputs and content settings.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from convseq import __version__
from convseq.data.config import DataConfig
from convseq.data.databin import FORMAT_VERSION, META_FILE, SPLITS, split_prefix
from convseq.data.dictionary import Dictionary
from convseq.data.encode import BlockEncoder, SymbolTable, segment_split
from convseq.data.indexed import token_dtype
from convseq.data.split_checks import require_pairs, require_text
from convseq.data.spool import SIDES, SplitSpool, remove_spool, write_lines, write_side
from convseq.data.subword import Segmenter
from convseq.data.subword_training import SPM_THREADS, train_segmenters, trains_on_sample
from convseq.data.textio import (
    PairFilter,
    TextInfo,
    check_same_length,
    iter_pairs,
    scan_text_file,
)
from convseq.data.vocab import build_dictionaries, load_given, vocab_meta

PROGRESS_MIN_LINES = 100_000  # a split this long (per side) gets progress bars
PROGRESS_MIN_BYTES = 8 << 20  # a file this big gets a progress bar while it is checked
CHUNK = 20_000  # pairs per segmentation block (one progress-bar tick, one worker task)
SPOOL = ".spool"  # folder of the provisional ids inside the data-bin being built


def content_settings(cfg: DataConfig, train_lines: Mapping[str, int] | None = None) -> dict:
    """Every setting that changes a data-bin's content (part of its key and of meta.json).

    `train_lines` bounds the line count of the train files per side (`src`, `tgt`). A sentencepiece
    sample size that no model's training input can exceed changes nothing and is recorded as 0
    (all sentences), so a corpus smaller than the sample keeps the key it had before the setting
    existed with a non-zero default.
    """
    sub = asdict(cfg.subword) if cfg.subword.type != "none" else {"type": "none"}
    if "input_sentence_size" in sub and train_lines is not None:
        if not trains_on_sample(cfg, train_lines["src"], train_lines["tgt"]):
            sub["input_sentence_size"] = 0
    settings = {
        "format": FORMAT_VERSION,
        "src_lang": cfg.src_lang,
        "tgt_lang": cfg.tgt_lang,
        "subword": sub,
        "vocab": asdict(cfg.vocab),
        "max_positions": cfg.max_positions,
        "train_invalid": cfg.train_invalid,
        "eval_overlong": cfg.eval_overlong,
        "drop_train_regex": cfg.drop_train_regex,
    }
    if cfg.test_sets:  # only when set: a corpus without extra sets keeps its key
        settings["test_sets"] = list(cfg.test_sets)
    return settings


def split_roles(cfg: DataConfig) -> tuple[str, ...]:
    """The data-bin's splits: train, valid, test, then the extra test sets in config order."""
    return (*SPLITS, *cfg.test_sets)


def split_inputs(cfg: DataConfig) -> dict[str, str]:
    """Each split's input file prefix (`{dir}/{prefix}.{lang}`), e.g. `{"test2017": "test1"}`."""
    names = {"train": cfg.train_split, "valid": cfg.valid_split, "test": cfg.test_split}
    return {**names, **cfg.test_sets}


def input_id(cfg: DataConfig, role: str, side: str) -> str:
    """The name of an input file inside the key and meta.json, e.g. `train.de`."""
    return f"{role}.{cfg.src_lang if side == 'src' else cfg.tgt_lang}"


def build_databin(
    cfg: DataConfig,
    paths: Mapping[tuple[str, str], Path],
    checksums: Mapping[str, str],
    key: str,
    out: Path,
    progress: bool = True,
) -> dict:
    """Read, check, segment, binarise every split into the folder `out`; return meta.json's dict."""
    start = time.perf_counter()
    roles = split_roles(cfg)
    sha = {(role, side): checksums[input_id(cfg, role, side)] for role in roles for side in SIDES}
    given = load_given(cfg, checksums)  # data.src_dict / data.tgt_dict: a bad file fails first

    # 1. check every file (no split may be empty), then filter the train text
    infos = _check_inputs(cfg, paths, sha, roles, progress)
    filters = _pair_filters(cfg, roles)
    masks = {
        role: _text_mask(filters[role], paths, sha, role, len(infos[role][0])) for role in roles
    }
    _require_pairs(cfg, paths, infos, filters, {"train": int(masks["train"].sum())})

    # 2. sentencepiece
    segmenters, models, trained_on = train_segmenters(cfg, paths, sha, masks["train"], out)

    # 3. segment, filter by length, count, spool
    tables, spools = _segment_splits(cfg, paths, sha, masks, filters, segmenters, out, progress)
    _require_pairs(cfg, paths, infos, filters, {r: spools[r].sentences for r in roles})

    # 4. dictionaries (given or from the train counts), then the token arrays
    src_dict, tgt_dict = build_dictionaries(cfg, tables[cfg.src_lang], tables[cfg.tgt_lang], given)
    src_dict.save(out / f"dict.{cfg.src_lang}.txt")
    tgt_dict.save(out / f"dict.{cfg.tgt_lang}.txt")
    splits_meta = {
        role: _write_split(
            cfg,
            role,
            infos[role],
            filters[role],
            spools[role],
            tables,
            (src_dict, tgt_dict),
            out,
            progress,
        )
        for role in roles
    }
    remove_spool(out / SPOOL)

    vocab = vocab_meta(cfg, (src_dict, tgt_dict), checksums)
    meta = _databin_meta(cfg, key, infos, segmenters, models, trained_on, vocab, splits_meta)
    meta["build_seconds"] = round(time.perf_counter() - start, 3)
    _write_meta(out / META_FILE, meta)
    return meta


def _check_inputs(
    cfg: DataConfig,
    paths: Mapping[tuple[str, str], Path],
    sha: Mapping[tuple[str, str], str],
    roles: tuple[str, ...],
    progress: bool,
) -> dict[str, tuple[TextInfo, TextInfo]]:
    """Step 1a: check every split's two files (UTF-8, checksum, stray carriage returns), that
    neither is without text and that the two sides have as many lines."""
    infos: dict[str, tuple[TextInfo, TextInfo]] = {}
    for role in roles:
        s_info, t_info = (_scan(paths[role, side], sha[role, side], progress) for side in SIDES)
        require_text(cfg, role, (s_info, t_info))  # first: a 0-line file says more than a count
        check_same_length(s_info, t_info)
        infos[role] = (s_info, t_info)
    return infos


def _pair_filters(cfg: DataConfig, roles: tuple[str, ...]) -> dict[str, PairFilter]:
    """Step 1b: one pair filter per split (train's drops what the settings say; the rest keep)."""
    return {
        role: PairFilter(
            is_train=role == "train",
            max_positions=cfg.max_positions,
            train_invalid=cfg.train_invalid,
            eval_overlong=cfg.eval_overlong,
            drop_regex=cfg.drop_train_regex,
        )
        for role in roles
    }


def _require_pairs(
    cfg: DataConfig,
    paths: Mapping[tuple[str, str], Path],
    infos: Mapping[str, tuple[TextInfo, TextInfo]],
    filters: Mapping[str, PairFilter],
    kept: Mapping[str, int],
) -> None:
    """Refuse a split with no pair left (`kept` pairs per split; see `split_checks`)."""
    for role, n in kept.items():
        files = (paths[role, "src"], paths[role, "tgt"])
        require_pairs(cfg, role, files, len(infos[role][0]), n, filters[role].skipped)


def _segment_splits(
    cfg: DataConfig,
    paths: Mapping[tuple[str, str], Path],
    sha: Mapping[tuple[str, str], str],
    masks: Mapping[str, np.ndarray],
    filters: Mapping[str, PairFilter],
    segmenters: Mapping[str, Segmenter],
    out: Path,
    progress: bool,
) -> tuple[dict[str, SymbolTable], dict[str, SplitSpool]]:
    """Step 3: segment every split's kept pairs, drop over-long ones, count train tokens and
    spool the provisional ids; return the symbol table per language and the spool per split."""
    src, tgt = cfg.src_lang, cfg.tgt_lang
    tables = {lang: SymbolTable(_pieces(segmenters[lang])) for lang in (src, tgt)}
    spools: dict[str, SplitSpool] = {}
    with BlockEncoder(segmenters[src], segmenters[tgt], cfg.workers, SPM_THREADS) as encoder:
        for role in masks:  # every split, in order
            spools[role] = SplitSpool(out / SPOOL, role)
            text = None
            if role != "train":  # the stripped input text of the kept lines (references)
                text = tuple(
                    out / (split_prefix(role, src, tgt, lang) + ".txt") for lang in (src, tgt)
                )
            src_path, tgt_path = paths[role, "src"], paths[role, "tgt"]
            segment_split(
                iter_pairs(src_path, tgt_path, CHUNK, sha[role, "src"], sha[role, "tgt"]),
                masks[role],
                filters[role],
                (src_path, tgt_path),
                encoder,
                (tables[src], tables[tgt]),
                spools[role],
                count=role == "train",
                text_paths=text,
                desc=f"segment {role}.{src}-{tgt}",
                show=progress and int(masks[role].sum()) >= PROGRESS_MIN_LINES,
            )
    return tables, spools


def _write_split(
    cfg: DataConfig,
    role: str,
    infos: tuple[TextInfo, TextInfo],
    pair_filter: PairFilter,
    spool: SplitSpool,
    tables: Mapping[str, SymbolTable],
    dicts: tuple[Dictionary, Dictionary],
    out: Path,
    progress: bool,
) -> dict:
    """Step 4: one split's token and offset arrays per side, from the spool through each
    dictionary's lookup table, and its line numbers; return the split's entry of meta.json."""
    src, tgt = cfg.src_lang, cfg.tgt_lang
    show = progress and spool.sentences >= PROGRESS_MIN_LINES
    info: dict = {
        "input": split_inputs(cfg)[role],
        "input_lines": len(infos[0]),
        "sentences": spool.sentences,
        "skipped": dict(sorted(pair_filter.skipped.items())),
    }
    for side, lang, d in (("src", src, dicts[0]), ("tgt", tgt, dicts[1])):
        lut = tables[lang].lookup_table(d.indices, d.unk_index, token_dtype(len(d)))
        prefix = out / split_prefix(role, src, tgt, lang)
        info[side] = write_side(
            prefix, spool, side, lut, d.eos_index, d.unk_index, f"{role}.{lang}", show
        )
    write_lines(out / (split_prefix(role, src, tgt) + ".lines.npy"), spool)
    return info


def _databin_meta(
    cfg: DataConfig,
    key: str,
    infos: Mapping[str, tuple[TextInfo, TextInfo]],
    segmenters: Mapping[str, Segmenter],
    models: dict[str, str],
    trained_on: dict[str, int],
    vocab: dict,
    splits_meta: dict[str, dict],
) -> dict:
    """meta.json's content, build_seconds aside: the settings, the inputs and the splits."""
    lines = {side: infos["train"][i].newlines + 1 for i, side in enumerate(SIDES)}
    settings = content_settings(cfg, lines)
    return {
        "format": FORMAT_VERSION,
        "key": key,
        "name": cfg.name,
        "src_lang": cfg.src_lang,
        "tgt_lang": cfg.tgt_lang,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "convseq_version": __version__,
        "subword": {
            **asdict(cfg.subword),
            "models": models,
            "pieces": {
                lang: seg.model.get_piece_size() for lang, seg in segmenters.items() if seg.model
            },
            "trained_on": trained_on,
        },
        "vocab": vocab,
        "max_positions": settings["max_positions"],
        "train_invalid": settings["train_invalid"],
        "eval_overlong": settings["eval_overlong"],
        "drop_train_regex": settings["drop_train_regex"],
        "settings": settings,
        "inputs": {
            input_id(cfg, role, side): {
                "path": str(ti.path),
                "sha256": ti.sha256,
                "bytes": ti.num_bytes,
                "lines": len(ti),
                "crlf": ti.crlf,
            }
            for role, pair in infos.items()
            for side, ti in zip(SIDES, pair)
        },
        "splits": splits_meta,
    }


def _write_meta(path: Path, meta: dict) -> None:
    """Write meta.json and sync it to disk."""
    with open(path, "w", encoding="utf-8") as f:  # written last: marks completion
        json.dump(meta, f, indent=2, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _scan(path: Path, sha256: str, progress: bool) -> TextInfo:
    show = progress and path.stat().st_size >= PROGRESS_MIN_BYTES
    with tqdm(desc=f"check {path.name}", unit="line", disable=not show) as bar:
        return scan_text_file(path, expect_sha256=sha256, on_block=bar.update)


def _text_mask(f: PairFilter, paths: Mapping, sha: Mapping, role: str, n_lines: int) -> np.ndarray:
    """One flag per input line: the pair passes the text checks (all of valid/test do)."""
    if not f.is_train:
        return np.ones(n_lines, dtype=bool)
    mask = np.zeros(n_lines, dtype=bool)
    for first, s, t in iter_pairs(
        paths[role, "src"], paths[role, "tgt"], CHUNK, sha[role, "src"], sha[role, "tgt"]
    ):
        mask[first : first + len(s)] = f.text_mask(
            first, s, t, paths[role, "src"], paths[role, "tgt"]
        )
    return mask


def _pieces(seg: Segmenter) -> list[str]:
    if seg.model is None:
        return []
    return [seg.model.id_to_piece(i) for i in range(seg.model.get_piece_size())]
