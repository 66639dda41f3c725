"""Building a data-bin's content: read and check the text, segment, build dictionaries, binarise.

`build_databin` writes every file of a data-bin into a folder and returns meta.json's dict; the
caching, locking and atomic renaming around it are in `convseq.data.preprocess`.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from itertools import chain
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from convseq import __version__
from convseq.data.config import DataConfig
from convseq.data.databin import FORMAT_VERSION, META_FILE, SPLITS, TEXT_SPLITS, split_prefix
from convseq.data.dictionary import Dictionary
from convseq.data.indexed import write_split
from convseq.data.subword import Segmenter, train_sentencepiece
from convseq.data.textio import PairFilter, TextFile, check_same_length, read_text_file
from convseq.errors import DataError

PROGRESS_MIN_LINES = 100_000  # a split this long (per side) gets progress bars
CHUNK = 20_000  # lines per segmentation/encoding step (one progress-bar tick)
SPM_THREADS = 2


def content_settings(cfg: DataConfig) -> dict:
    """Every setting that changes a data-bin's content (part of its key and of meta.json)."""
    sub = asdict(cfg.subword) if cfg.subword.type != "none" else {"type": "none"}
    return {
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
    src, tgt = cfg.src_lang, cfg.tgt_lang
    texts: dict[str, tuple[TextFile, TextFile]] = {}
    for role in SPLITS:
        pair = (read_text_file(paths[role, "src"]), read_text_file(paths[role, "tgt"]))
        for side, tf in zip(("src", "tgt"), pair):
            if tf.sha256 != checksums[input_id(cfg, role, side)]:
                raise DataError("file changed while preprocessing; run again", path=str(tf.path))
        check_same_length(*pair)
        texts[role] = pair

    filters = {
        role: PairFilter(
            is_train=role == "train",
            max_positions=cfg.max_positions,
            train_invalid=cfg.train_invalid,
            eval_overlong=cfg.eval_overlong,
            drop_regex=cfg.drop_train_regex,
        )
        for role in SPLITS
    }
    kept = {role: filters[role].keep_text(*texts[role]) for role in SPLITS}
    train_src, train_tgt = texts["train"]
    segmenters, models = _train_segmenters(
        cfg,
        [train_src.lines[i] for i in kept["train"]],
        [train_tgt.lines[i] for i in kept["train"]],
        out,
    )

    tokens: dict[str, tuple[list[list[str]], list[list[str]]]] = {}
    for role in SPLITS:
        s_file, t_file = texts[role]
        show = progress and len(kept[role]) >= PROGRESS_MIN_LINES
        s_tok = _segment(
            segmenters[src], [s_file.lines[i] for i in kept[role]], f"{role}.{src}", show
        )
        t_tok = _segment(
            segmenters[tgt], [t_file.lines[i] for i in kept[role]], f"{role}.{tgt}", show
        )
        pos = filters[role].keep_lengths(
            kept[role], [len(x) for x in s_tok], [len(x) for x in t_tok], s_file, t_file
        )
        if len(pos) != len(s_tok):
            kept[role] = [kept[role][j] for j in pos]
            s_tok, t_tok = [s_tok[j] for j in pos], [t_tok[j] for j in pos]
        tokens[role] = (s_tok, t_tok)

    src_dict, tgt_dict = _build_dicts(cfg, *tokens["train"])
    src_dict.save(out / f"dict.{src}.txt")
    tgt_dict.save(out / f"dict.{tgt}.txt")

    splits_meta: dict[str, dict] = {}
    for role in SPLITS:
        show = progress and len(kept[role]) >= PROGRESS_MIN_LINES
        info: dict = {
            "input": {"train": cfg.train_split, "valid": cfg.valid_split, "test": cfg.test_split}[
                role
            ],
            "input_lines": len(texts[role][0]),
            "sentences": len(kept[role]),
            "skipped": dict(sorted(filters[role].skipped.items())),
        }
        for side, lang, d, toks in (
            ("src", src, src_dict, tokens[role][0]),
            ("tgt", tgt, tgt_dict, tokens[role][1]),
        ):
            info[side] = _write_side(
                out / split_prefix(role, src, tgt, lang), d, toks, f"{role}.{lang}", show
            )
        _save_npy(out / (split_prefix(role, src, tgt) + ".lines.npy"), kept[role])
        if role in TEXT_SPLITS:
            for lang, tf in zip((src, tgt), texts[role]):
                text = "".join(tf.lines[i] + "\n" for i in kept[role])
                (out / (split_prefix(role, src, tgt, lang) + ".txt")).write_text(
                    text, encoding="utf-8"
                )
        splits_meta[role] = info

    settings = content_settings(cfg)
    meta = {
        "format": FORMAT_VERSION,
        "key": key,
        "name": cfg.name,
        "src_lang": src,
        "tgt_lang": tgt,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "convseq_version": __version__,
        "subword": {
            **asdict(cfg.subword),
            "models": models,
            "pieces": {
                lang: seg.model.get_piece_size() for lang, seg in segmenters.items() if seg.model
            },
        },
        "vocab": {**asdict(cfg.vocab), "src_size": len(src_dict), "tgt_size": len(tgt_dict)},
        "max_positions": settings["max_positions"],
        "train_invalid": settings["train_invalid"],
        "eval_overlong": settings["eval_overlong"],
        "drop_train_regex": settings["drop_train_regex"],
        "settings": settings,
        "inputs": {
            input_id(cfg, role, side): {
                "path": str(tf.path),
                "sha256": tf.sha256,
                "bytes": tf.num_bytes,
                "lines": len(tf),
                "crlf": tf.crlf,
            }
            for role in SPLITS
            for side, tf in zip(("src", "tgt"), texts[role])
        },
        "splits": splits_meta,
    }
    meta["build_seconds"] = round(time.perf_counter() - start, 3)
    with open(out / META_FILE, "w", encoding="utf-8") as f:  # written last: marks completion
        json.dump(meta, f, indent=2, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    return meta


def _train_segmenters(
    cfg: DataConfig, train_src: Sequence[str], train_tgt: Sequence[str], out: Path
) -> tuple[dict[str, Segmenter], dict[str, str]]:
    """Segmenters per language (sentencepiece trained on train only) and their model file names."""
    src, tgt = cfg.src_lang, cfg.tgt_lang
    sub = cfg.subword
    if sub.type == "none":
        return {src: Segmenter(None), tgt: Segmenter(None)}, {}
    options = dict(
        model_type=sub.type,
        vocab_size=sub.vocab_size,
        character_coverage=sub.character_coverage,
        input_sentence_size=sub.input_sentence_size,
        num_threads=SPM_THREADS,
    )
    if sub.joint:
        seg = train_sentencepiece(chain(train_src, train_tgt), out / "spm.model", **options)
        return {src: seg, tgt: seg}, {src: "spm.model", tgt: "spm.model"}
    segs, models = {}, {}
    for lang, lines in ((src, train_src), (tgt, train_tgt)):
        models[lang] = f"spm.{lang}.model"
        segs[lang] = train_sentencepiece(lines, out / models[lang], **options)
    return segs, models


def _segment(seg: Segmenter, lines: Sequence[str], desc: str, show: bool) -> list[list[str]]:
    out: list[list[str]] = []
    with tqdm(total=len(lines), desc=f"segment {desc}", unit="line", disable=not show) as bar:
        for start in range(0, len(lines), CHUNK):
            chunk = lines[start : start + CHUNK]
            out.extend(seg.segment_many(chunk))
            bar.update(len(chunk))
    return out


def _build_dicts(
    cfg: DataConfig, src_tokens: Sequence[Sequence[str]], tgt_tokens: Sequence[Sequence[str]]
) -> tuple[Dictionary, Dictionary]:
    """Dictionaries from the kept train tokens: one joined or one per side."""
    v = cfg.vocab

    def build(*token_lists: Sequence[Sequence[str]]) -> Dictionary:
        d = Dictionary()
        # Counter over one flat iterator: the counting loop runs in C.
        d.add_counts(Counter(chain.from_iterable(chain(*token_lists))))
        d.finalize(threshold=v.threshold, nwords=v.nwords, padding_factor=v.padding_factor)
        return d

    if v.joined:
        d = build(src_tokens, tgt_tokens)
        return d, d
    return build(src_tokens), build(tgt_tokens)


def _write_side(
    prefix: Path, d: Dictionary, token_lists: Sequence[Sequence[str]], desc: str, show: bool
) -> dict:
    """Encode and write one split side; return its counts for meta.json."""
    get, unk, eos = d.indices.get, d.unk_index, d.eos_index
    encoded: list[list[int]] = []
    n_unk = 0
    for toks in tqdm(
        token_lists, desc=f"binarise {desc}", unit="line", disable=not show, miniters=CHUNK
    ):
        ids = [get(t, unk) for t in toks]
        n_unk += ids.count(unk)
        ids.append(eos)
        encoded.append(ids)
    write_split(prefix, encoded, len(d))
    n_tok = sum(len(ids) for ids in encoded)
    return {
        "tokens": n_tok,  # EOS included, as fairseq-preprocess counts them
        "unk": n_unk,
        "unk_rate": n_unk / n_tok if n_tok else 0.0,
        "max_len": max((len(ids) for ids in encoded), default=0),
    }


def _save_npy(path: Path, values: Sequence[int]) -> None:
    np.save(path, np.asarray(values, dtype=np.int64))


# -- reporting ----------------------------------------------------------------------------------
def format_summary(path: Path, meta: dict) -> str:
    """A short table: sentences, tokens, unk % and skipped pairs per split."""
    src, tgt = meta["src_lang"], meta["tgt_lang"]
    lines = [
        f"data-bin {meta['name']} {src}->{tgt}: {path} (built in {meta['build_seconds']:.1f} s)",
        f"  {'split':<6}{'sentences':>10}{src + ' tok':>12}{tgt + ' tok':>12}"
        f"{src + ' unk%':>10}{tgt + ' unk%':>10}  skipped",
    ]
    for role, info in meta["splits"].items():
        skipped = sum(info["skipped"].values())
        reasons = ", ".join(f"{k} {n}" for k, n in info["skipped"].items())
        lines.append(
            f"  {role:<6}{info['sentences']:>10}{info['src']['tokens']:>12}{info['tgt']['tokens']:>12}"
            f"{100 * info['src']['unk_rate']:>10.2f}{100 * info['tgt']['unk_rate']:>10.2f}  "
            f"{skipped}" + (f" ({reasons})" if reasons else "")
        )
    vocab, sub = meta["vocab"], meta["subword"]
    seg = (
        "whitespace tokens"
        if sub["type"] == "none"
        else (
            f"sentencepiece {sub['type']} {'joint' if sub['joint'] else 'per language'}, pieces "
            + ", ".join(f"{k} {n}" for k, n in sub["pieces"].items())
        )
    )
    joined = " (joined)" if vocab["joined"] else ""
    lines.append(
        f"  dictionaries: {src} {vocab['src_size']}, {tgt} {vocab['tgt_size']} symbols{joined}; {seg}"
    )
    return "\n".join(lines)
