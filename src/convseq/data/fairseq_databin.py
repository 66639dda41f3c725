"""A folder written by fairseq-preprocess, read as it is: `data.format=fairseq data.path=DIR`.

The folder holds `dict.<lang>.txt` and, per split and side, `<split>.<src>-<tgt>.<lang>.bin/.idx`
in fairseq's mmap format (`convseq.data.fairseq_mmap`). `FairseqDataBin` implements
`convseq.data.base_databin.BaseDataBin`, as convseq's `convseq.data.databin.DataBin` does
(dictionaries, splits, reference text, segmentation), so training, validation, BLEU and
generation use either one alike. The ids are used as they are: fairseq-preprocess ends every
sentence with EOS, as convseq's preprocessing does, so the same ids give the same batches.

What differs from convseq's own data-bin: the text was segmented before fairseq-preprocess (its
BPE or sentencepiece model is not in the folder), so the BLEU references are the dictionary's
pieces of each target sentence joined back with `data.remove_bpe` (unknown words read `<unk>`);
`gen.reference=FILE` scores against raw text instead.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from convseq.data.base_databin import BaseDataBin
from convseq.data.config import DataConfig
from convseq.data.dictionary import Dictionary
from convseq.data.fairseq_mmap import RERUN, FairseqTokenArray
from convseq.data.subword import Segmenter
from convseq.errors import DataError

ROLES = ("train", "valid", "test")


def language_pairs(folder: Path) -> list[tuple[str, str]]:
    """The (source, target) pairs the folder's file names spell, `<split>.<a>-<b>.<...>`, as
    fairseq reads them; a pair and its reverse count once (fairseq reads either direction)."""
    found: dict[frozenset, tuple[str, str]] = {}
    for name in sorted(os.listdir(folder)):
        parts = name.split(".")
        langs = parts[1].split("-") if len(parts) >= 3 else []
        if len(langs) == 2 and all(langs) and langs[0] != langs[1] and not name.startswith("dict."):
            found.setdefault(frozenset(langs), (langs[0], langs[1]))
    return list(found.values())


def infer_pair(folder: Path, src: str | None, tgt: str | None) -> tuple[str, str]:
    """The pair to read: data.src_lang / data.tgt_lang when given, else the one in the names.

    Raises:
        DataError: only one language given, no pair found, or several (named) without a choice.
    """
    if (src is None) != (tgt is None):
        raise DataError(
            "give both data.src_lang and data.tgt_lang (or neither: the pair is read from the "
            "file names)",
            path=str(folder),
        )
    if src is not None and tgt is not None:
        return src, tgt
    pairs = language_pairs(folder)
    if not pairs:
        raise DataError(
            "no <split>.<src>-<tgt>.<lang>.bin/.idx files: not a folder written by "
            "fairseq-preprocess (give its --destdir as data.path)",
            path=str(folder),
        )
    if len(pairs) > 1:
        names = ", ".join(sorted(f"{a}-{b}" for a, b in pairs))
        raise DataError(
            f"holds several language pairs ({names}): choose one with data.src_lang=... "
            "data.tgt_lang=...",
            path=str(folder),
        )
    return pairs[0]


class FairseqDataBin(BaseDataBin):
    """A fairseq-preprocess folder read as a data-bin (see the module docstring).

    Args:
        path: the folder (fairseq-preprocess's --destdir).
        src_lang, tgt_lang: the direction; None for both: the one pair the file names spell.
        splits: role (train, valid, test) -> split name in the file names.
        test_sets: extra evaluation set -> split name in the file names (fairseq's test1, ...).
        remove_bpe: how pieces become text (`convseq.data.subword.REMOVE_BPE`), or None.

    Raises:
        DataError: a missing folder or dictionary, or an ambiguous language pair.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        splits: Mapping[str, str] | None = None,
        test_sets: Mapping[str, str] | None = None,
        remove_bpe: str | None = None,
    ):
        self.path = Path(path).expanduser().absolute()
        if not self.path.is_dir():
            raise DataError(
                "data.path: no such folder; give the folder fairseq-preprocess wrote (--destdir)",
                path=str(self.path),
            )
        self.src_lang, self.tgt_lang = infer_pair(self.path, src_lang, tgt_lang)
        self._names = {**{r: r for r in ROLES}, **dict(splits or {}), **dict(test_sets or {})}
        self._test_sets = list(test_sets or {})
        self._segmenter = Segmenter(None, remove_bpe=remove_bpe)
        self.src_dict = Dictionary.load(self.path / f"dict.{self.src_lang}.txt")
        self.tgt_dict = Dictionary.load(self.path / f"dict.{self.tgt_lang}.txt")
        self._splits: dict[str, tuple[FairseqTokenArray, FairseqTokenArray]] = {}

    @classmethod
    def from_config(cls, cfg) -> FairseqDataBin:
        """The data-bin a validated `DataConfig` with `format: fairseq` names."""
        roles = {"train": cfg.train_split, "valid": cfg.valid_split, "test": cfg.test_split}
        return cls(cfg.path, cfg.src_lang, cfg.tgt_lang, roles, cfg.test_sets, cfg.remove_bpe)

    # -- what differs from convseq's data-bin ---------------------------------------------------
    def segmenter(self, side: str) -> Segmenter:
        """Whitespace pieces (segmented before fairseq-preprocess), joined with `remove_bpe`."""
        self.lang(side)
        return self._segmenter

    @property
    def test_sets(self) -> list[str]:
        """The extra evaluation sets (`data.test_sets`), in the order the config named them."""
        return list(self._test_sets)

    @property
    def keeps_text(self) -> bool:
        """False: the folder holds ids only; the references are rebuilt from them (`text`)."""
        return False

    def has_split(self, name: str) -> bool:
        """Whether the config names split `name` and the folder holds both its sides' files."""
        return name in self._names and all(
            self._found(name, side) is not None for side in ("src", "tgt")
        )

    def sizes(self) -> dict[str, Any]:
        """The pair, and the sentences of each role (train, valid, test) the folder holds."""
        splits = {
            role: {"sentences": len(self._side(role, "src", scan=False))}
            for role in ROLES
            if self.has_split(role)
        }
        return {"src_lang": self.src_lang, "tgt_lang": self.tgt_lang, "splits": splits}

    def split(self, name: str) -> tuple[FairseqTokenArray, FairseqTokenArray]:
        """The (source, target) arrays of split `name`, checked against each other and the
        dictionaries (the largest id of each side, scanned once)."""
        if name not in self._splits:
            src, tgt = (self._side(name, side) for side in ("src", "tgt"))
            if len(src) != len(tgt):
                raise DataError(
                    f"{len(src)} source sentences but {len(tgt)} in {tgt.prefix}.idx: the two "
                    f"sides of a split must pair up; {RERUN}",
                    path=src.prefix + ".idx",
                )
            self._splits[name] = (src, tgt)
        return self._splits[name]

    def _side(self, name: str, side: str, scan: bool = True) -> FairseqTokenArray:
        """One side of split `name`; `scan`: also check its ids against the dictionary."""
        prefix = self.prefix(name, side)
        _refuse_raw(prefix)
        arr = FairseqTokenArray(prefix)
        if not scan:
            return arr
        d = self.dictionary(side)
        top = arr.max_id()
        if top >= len(d):
            raise DataError(
                f"holds token id {top} but dict.{self.lang(side)}.txt has {len(d)} symbols (ids "
                f"0-{len(d) - 1}): the dictionary is not the one this split was binarised with",
                path=prefix + ".bin",
            )
        return arr

    def prefix(self, name: str, side: str) -> str:
        """`<path>/<split>.<a>-<b>.<lang>` of split `name`: the source-target file names, else
        the target-source ones (a data-bin serves both directions, as in fairseq)."""
        if name not in self._names:
            raise DataError(
                f"no split {name!r} (this data config names {sorted(self._names)})",
                path=str(self.path),
            )
        split = self._names[name]
        p = self._found(name, side)
        if p is None:
            forward, backward = self._candidates(name, side)
            raise DataError(
                f"split {name!r}: neither {forward.name}.bin/.idx nor {backward.name}.bin/.idx is "
                "there (fairseq-preprocess writes them from --trainpref, --validpref, --testpref)",
                path=str(self.path),
            )
        shard = p.with_name(p.name.replace(split, f"{split}1", 1))
        if Path(f"{shard}.idx").exists():  # fairseq concatenates split, split1, ...
            raise DataError(
                f"split {name!r} is sharded ({split}, {split}1, ...); convseq reads one "
                "file per split: re-run fairseq-preprocess with the text joined into one "
                "prefix",
                path=f"{shard}.idx",
            )
        return str(p)

    def _candidates(self, name: str, side: str) -> tuple[Path, Path]:
        """The source-target and the target-source prefix of split `name`'s `side`."""
        split, lang = self._names[name], self.lang(side)
        forward = self.path / f"{split}.{self.src_lang}-{self.tgt_lang}.{lang}"
        backward = self.path / f"{split}.{self.tgt_lang}-{self.src_lang}.{lang}"
        return forward, backward

    def _found(self, name: str, side: str) -> Path | None:
        """The first of `_candidates` that has a file (.idx, .bin or a raw text), else None."""
        for p in self._candidates(name, side):
            if any(Path(f"{p}{ext}").exists() for ext in (".idx", ".bin", "")):
                return p
        return None

    def lines(self, name: str) -> np.ndarray:
        """0-based sentence numbers: a fairseq data-bin keeps every line of its input."""
        return np.arange(len(self.split(name)[0]), dtype=np.int64)

    def text(self, name: str, side: str = "tgt") -> list[str]:
        """The references of split `name`: each sentence's pieces joined with `remove_bpe`."""
        arr = self.split(name)[0 if side == "src" else 1]
        return [self.decode(arr[i], side) for i in range(len(arr))]

    def check(self) -> None:
        """Open every split the config names, checking its files against each other (the ids
        against the dictionaries are checked when a split is used); raise DataError if not."""
        for name in self._names:
            if name not in self._splits:
                src, tgt = (self._side(name, side, scan=False) for side in ("src", "tgt"))
                if len(src) != len(tgt):
                    self.split(name)  # raises, naming both files

    def describe_split(self, name: str) -> str:
        """Where split `name` comes from, for messages."""
        src, _ = self.split(name)
        base = self.prefix(name, "src").rsplit(".", 1)[0]
        return f"fairseq data-bin split {base} ({len(src)} pairs)"

    def summary(self) -> str:
        """A short table: sentences, tokens and unk % per split, and the dictionaries."""
        s, t = self.src_lang, self.tgt_lang
        lines = [
            f"fairseq data-bin {s}->{t}: {self.path}",
            f"  {'split':<8}{'sentences':>10}{s + ' tok':>12}{t + ' tok':>12}"
            f"{s + ' unk%':>10}{t + ' unk%':>10}",
        ]
        for name in self._names:
            arrays = self.split(name)
            counts = [len(a.tokens) for a in arrays]
            unk = [
                _share(a.tokens, d.unk()) for a, d in zip(arrays, (self.src_dict, self.tgt_dict))
            ]
            lines.append(
                f"  {name:<8}{len(arrays[0]):>10}{counts[0]:>12}{counts[1]:>12}"
                f"{100 * unk[0]:>10.2f}{100 * unk[1]:>10.2f}"
            )
        lines.append(
            f"  dictionaries: {s} {len(self.src_dict)}, {t} {len(self.tgt_dict)} symbols; pieces "
            f"joined with remove_bpe={self._segmenter.remove_bpe or 'none'}"
        )
        return "\n".join(lines)


def _refuse_raw(prefix: str) -> None:
    """fairseq's `raw` data-bin (text copies, no .bin/.idx), by name; `lazy`/`cached` ones are
    refused by their index's magic (`convseq.data.fairseq_mmap.read_index`)."""
    if Path(prefix).is_file() and not Path(prefix + ".idx").exists():
        raise DataError(
            f"a fairseq 'raw' data-bin (text, no .bin/.idx): convseq reads binarised ones; "
            f"{RERUN} (or train on the text itself with convseq's own data config)",
            path=prefix,
        )


def _share(tokens: np.ndarray, value: int) -> float:
    """The share of `tokens` equal to `value`, counted block by block."""
    if len(tokens) == 0:
        return 0.0
    block = 1 << 24
    hits = sum(int((tokens[i : i + block] == value).sum()) for i in range(0, len(tokens), block))
    return hits / len(tokens)


def fairseq_record(cfg: DataConfig, databin: BaseDataBin | None) -> DataConfig:
    """What a run records of a fairseq data config: `path` absolute and, once the data-bin is
    open, the language pair read from its file names (generation checks and reuses both)."""
    if cfg.path:
        cfg = dataclasses.replace(cfg, path=str(Path(cfg.path).expanduser().absolute()))
    if databin is not None:
        cfg = dataclasses.replace(cfg, src_lang=databin.src_lang, tgt_lang=databin.tgt_lang)
    return cfg
