"""The embedded default corpus (`data=toy`): written on first use, nothing downloaded.

`write_toy_corpus` writes `{train,valid,test}.{src,tgt}` from the grammar of
`convseq.data.toy.grammar`; the same seed and sizes give the same bytes. `lexicon_baseline` is the
word-by-word gloss in source order that the corpus is designed to defeat.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections import Counter
from functools import lru_cache
from pathlib import Path

from filelock import FileLock

from convseq.data.toy.grammar import ToyPair, generate_pairs
from convseq.data.toy.lexicon import build_lexicon
from convseq.errors import DataError

__all__ = [
    "TOY_VERSION",
    "ToyPair",
    "baseline_dictionary",
    "build_lexicon",
    "generate_pairs",
    "lexicon_baseline",
    "toy_splits",
    "write_toy_corpus",
]

log = logging.getLogger(__name__)

TOY_VERSION = 1  # bump whenever the grammar or lexicon changes what a seed produces
STAMP = "toy.json"
SPLITS = ("train", "valid", "test")
LANGS = ("src", "tgt")


def toy_splits(
    seed: int = 1, n_train: int = 20000, n_valid: int = 1000, n_test: int = 1000
) -> dict[str, list[ToyPair]]:
    """Draw the three splits in memory: distinct source sentences throughout, so no valid or test
    sentence ever appears in train.

    Raises:
        ValueError: a size is negative, or train is empty.
    """
    sizes = {"train": n_train, "valid": n_valid, "test": n_test}
    for name, n in sizes.items():
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"toy corpus: n_{name} must be a non-negative int, got {n!r}")
    if n_train < 1:
        raise ValueError("toy corpus: n_train must be at least 1")
    total = n_train + n_valid + n_test
    seen: set[str] = set()  # membership only
    unique: list[ToyPair] = []
    for drawn, pair in enumerate(generate_pairs(seed), start=1):
        key = " ".join(pair.src)
        if key not in seen:
            seen.add(key)
            unique.append(pair)
            if len(unique) == total:
                break
        if drawn > 20 * total + 1000:  # a guard, never reached at the sizes used
            raise ValueError(f"toy corpus: cannot draw {total} distinct sentences")
    return {
        "train": unique[:n_train],
        "valid": unique[n_train : n_train + n_valid],
        "test": unique[n_train + n_valid :],
    }


def _settings(seed: int, n_train: int, n_valid: int, n_test: int) -> dict:
    return {
        "version": TOY_VERSION,
        "seed": seed,
        "n_train": n_train,
        "n_valid": n_valid,
        "n_test": n_test,
    }


def _file_names() -> list[str]:
    return [f"{split}.{lang}" for split in SPLITS for lang in LANGS]


def _read_stamp(out_dir: Path) -> dict | None:
    try:
        stamp = json.loads((out_dir / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def _is_complete(out_dir: Path, settings: dict) -> bool:
    """True if `out_dir` holds every file of a corpus made with `settings`, at its recorded size."""
    stamp = _read_stamp(out_dir)
    if stamp is None or stamp.get("settings") != settings or not stamp.get("complete"):
        return False
    sizes = stamp.get("bytes", {})
    for name in _file_names():
        path = out_dir / name
        if not path.is_file() or path.stat().st_size != sizes.get(name):
            return False
    return True


def _write_lines(path: Path, lines: list[str]) -> int:
    text = "".join(line + "\n" for line in lines)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    return path.stat().st_size


def _write_stamp(folder: Path, stamp: dict) -> None:
    tmp = folder / (STAMP + ".tmp")
    tmp.write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, folder / STAMP)


def write_toy_corpus(
    out_dir: str | Path,
    seed: int = 1,
    n_train: int = 20000,
    n_valid: int = 1000,
    n_test: int = 1000,
) -> dict:
    """Write the toy corpus into `out_dir` unless it already holds this exact corpus.

    Files: `{train,valid,test}.{src,tgt}` (whitespace-tokenized, one sentence a line, UTF-8, LF)
    and a `toy.json` stamp with the settings. The files are written in a temporary folder beside
    `out_dir` and renamed into place under a lock (`out_dir` + ".lock"), so concurrent callers
    see either no corpus or a complete one.

    Args:
        out_dir: the folder to fill (created if missing).
        seed: the generator seed (lexicon and sentences); same seed and sizes -> same bytes.
        n_train, n_valid, n_test: sentence pairs per split.

    Returns:
        The number of pairs per split: {"train": ..., "valid": ..., "test": ...}.

    Raises:
        DataError: `out_dir` holds corpus files that the generator did not write.
        ValueError: a size is negative or train is empty.
    """
    out_dir = Path(out_dir)
    settings = _settings(seed, n_train, n_valid, n_test)
    counts = {"train": n_train, "valid": n_valid, "test": n_test}
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir) + ".lock"):
        if _is_complete(out_dir, settings):
            return counts
        _refuse_foreign_files(out_dir)
        splits = toy_splits(seed, n_train, n_valid, n_test)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
        try:
            sizes = _write_splits(tmp, splits)
            stamp = {"settings": settings, "counts": counts, "bytes": sizes, "complete": True}
            _write_stamp(tmp, stamp)
            _move_into_place(tmp, out_dir, stamp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("toy corpus (seed %d) written to %s: %s", seed, out_dir, counts)
    return counts


def _refuse_foreign_files(out_dir: Path) -> None:
    """Raise DataError when `out_dir` holds corpus files without the generator's stamp."""
    if not out_dir.exists() or _read_stamp(out_dir) is not None:
        return
    clash = [n for n in _file_names() if (out_dir / n).exists()]
    if clash:
        raise DataError(
            f"holds {', '.join(clash)} but no {STAMP} stamp of the toy generator; "
            "remove those files or point data.dir at another folder",
            path=str(out_dir),
        )


def _write_splits(folder: Path, splits: dict[str, list[ToyPair]]) -> dict[str, int]:
    """Write `{split}.{lang}` for every split and side into `folder`; their sizes in bytes."""
    sizes = {}
    for split in SPLITS:
        pairs = splits[split]
        for lang in LANGS:
            lines = [" ".join(getattr(p, lang)) for p in pairs]
            sizes[f"{split}.{lang}"] = _write_lines(folder / f"{split}.{lang}", lines)
    return sizes


def _move_into_place(tmp: Path, out_dir: Path, stamp: dict) -> None:
    """Move the finished corpus in `tmp` (files and stamp) to `out_dir`."""
    if not out_dir.exists():
        os.replace(tmp, out_dir)  # one atomic rename
        return
    # A folder that already exists (an older toy corpus, or an empty folder): mark it incomplete
    # first so that a crash half-way is regenerated, not reused.
    _write_stamp(out_dir, {**stamp, "complete": False})
    for name in _file_names():
        os.replace(tmp / name, out_dir / name)
    os.replace(tmp / STAMP, out_dir / STAMP)


@lru_cache(maxsize=8)
def baseline_dictionary(seed: int = 1, sample: int = 5000) -> dict[str, str]:
    """A naive bilingual dictionary: each source word -> its most common aligned target word.

    Counted over the first `sample` generated pairs (ties broken alphabetically); source words
    without a target counterpart ("does", "do", "did") are absent.
    """
    counts: dict[str, Counter] = {}
    for pair in generate_pairs(seed, sample):
        for j, i in enumerate(pair.align):
            if i >= 0:
                counts.setdefault(pair.src[i], Counter())[pair.tgt[j]] += 1
    return {
        word: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        for word, c in sorted(counts.items())
    }


def lexicon_baseline(src_line: str, seed: int = 1) -> str:
    """Translate word by word in source order with `baseline_dictionary(seed)`.

    Words the dictionary lacks (the auxiliaries "does"/"do"/"did") are dropped.
    """
    table = baseline_dictionary(seed)
    return " ".join(table[w] for w in src_line.split() if w in table)
