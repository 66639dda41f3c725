"""Reading a finished data-bin: dictionaries, binarised splits, segmentation, reference text.

Layout of a data-bin folder for languages `S` -> `T` (made by `convseq.data.preprocess`):

    meta.json                     counts, unk rates, skipped pairs, settings, input checksums
    dict.S.txt, dict.T.txt        fairseq dict.txt (a joined dictionary is written under both)
    spm.model | spm.S.model ...   sentencepiece model(s), when segmentation is on
    {split}.S-T.{S,T}.tokens.npy  token ids of every sentence, EOS included (see indexed.py)
    {split}.S-T.{S,T}.offsets.npy sentence boundaries
    {split}.S-T.lines.npy         0-based line of each kept sentence in the input file
    {valid,test}.S-T.{S,T}.txt    the stripped input text of the kept lines (BLEU references)

`split` is the role (`train`, `valid`, `test`), whatever the input files were called, or the name
of an extra evaluation set (`data.test_sets`), which is stored as the test split is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from convseq.data.base_databin import BaseDataBin
from convseq.data.dictionary import Dictionary
from convseq.data.indexed import TokenArray
from convseq.data.subword import Segmenter
from convseq.errors import DataError

FORMAT_VERSION = 1
META_FILE = "meta.json"
SPLITS = ("train", "valid", "test")


def split_prefix(split: str, src_lang: str, tgt_lang: str, lang: str | None = None) -> str:
    """File prefix of a split side inside a data-bin: `train.de-en.de` (no lang: `train.de-en`)."""
    base = f"{split}.{src_lang}-{tgt_lang}"
    return base if lang is None else f"{base}.{lang}"


class DataBin(BaseDataBin):
    """convseq's data-bin folder; everything is checked against `meta.json` as it is loaded.

    Args:
        path: the folder returned by `prepare_databin`.

    Raises:
        DataError: the folder, `meta.json`, a dictionary or a model is missing or inconsistent.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_dir():
            raise DataError(
                "data-bin folder not found; run preprocessing first", path=str(self.path)
            )
        meta_path = self.path / META_FILE
        if not meta_path.is_file():
            raise DataError(
                f"{META_FILE} missing: this is not a finished data-bin (an interrupted build?); "
                "delete the folder and re-run preprocessing",
                path=str(self.path),
            )
        try:
            self.meta: dict = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(
                f"cannot parse ({e}); delete the data-bin and re-run preprocessing",
                path=str(meta_path),
            ) from e
        if self.meta.get("format") != FORMAT_VERSION:
            raise DataError(
                f"data-bin format {self.meta.get('format')!r} is not the supported "
                f"{FORMAT_VERSION}; delete it and re-run preprocessing",
                path=str(meta_path),
            )
        self.src_lang: str = self.meta["src_lang"]
        self.tgt_lang: str = self.meta["tgt_lang"]
        self.src_dict = self._load_dict("src")
        self.tgt_dict = self._load_dict("tgt")
        self._splits: dict[str, tuple[TokenArray, TokenArray]] = {}
        self._segmenters: dict[str, Segmenter] = {}

    # -- dictionaries and segmentation ----------------------------------------------------------
    def _load_dict(self, side: str) -> Dictionary:
        path = self.path / f"dict.{self.lang(side)}.txt"
        d = Dictionary.load(path)
        expected = self.meta["vocab"][f"{side}_size"]
        if len(d) != expected:
            raise DataError(
                f"dictionary has {len(d)} symbols but {META_FILE} says {expected}; the data-bin is "
                "damaged: delete it and re-run preprocessing",
                path=str(path),
            )
        return d

    def segmenter(self, side: str) -> Segmenter:
        """The segmenter of `side`: sentencepiece when the data-bin was segmented, else whitespace."""
        lang = self.lang(side)
        if lang not in self._segmenters:
            model = self.meta["subword"].get("models", {}).get(lang)
            self._segmenters[lang] = Segmenter.load(self.path / model if model else None)
        return self._segmenters[lang]

    def encode(self, text: str, side: str = "src") -> np.ndarray:
        """Ids of raw text as preprocessing would binarise it: stripped, segmented, EOS appended."""
        tokens = self.segmenter(side).segment(text.strip())
        return self.dictionary(side).encode(tokens, append_eos=True)

    # -- splits ---------------------------------------------------------------------------------
    @property
    def test_sets(self) -> list[str]:
        """The extra evaluation sets (`data.test_sets`), in the order the config named them."""
        return list(self.meta.get("settings", {}).get("test_sets", []))

    @property
    def keeps_text(self) -> bool:
        """True: the stripped input text of valid, test and the extra test sets is kept."""
        return True

    def has_split(self, name: str) -> bool:
        """Whether `meta.json` lists split `name`."""
        return name in self.meta["splits"]

    def sizes(self) -> dict[str, Any]:
        """`meta.json`: languages, and per split its sentences, tokens, unk rates and skips."""
        return dict(self.meta)

    def split(self, name: str) -> tuple[TokenArray, TokenArray]:
        """The (source, target) token arrays of split `name` (train, valid or test)."""
        if name not in self._splits:
            info = self._split_meta(name)
            arrays = []
            for side in ("src", "tgt"):
                prefix = self.path / split_prefix(
                    name, self.src_lang, self.tgt_lang, self.lang(side)
                )
                arr = TokenArray(prefix)
                want_n, want_tok = info["sentences"], info[side]["tokens"]
                if len(arr) != want_n or len(arr.tokens) != want_tok:
                    raise DataError(
                        f"holds {len(arr)} sentences / {len(arr.tokens)} tokens but {META_FILE} "
                        f"says {want_n} / {want_tok}; the data-bin is damaged: delete it and "
                        "re-run preprocessing",
                        path=str(prefix) + ".tokens.npy",
                    )
                arrays.append(arr)
            self._splits[name] = (arrays[0], arrays[1])
        return self._splits[name]

    def lines(self, name: str) -> np.ndarray:
        """0-based input line of each sentence of split `name` (tells which lines were skipped)."""
        self._split_meta(name)
        path = self.path / (split_prefix(name, self.src_lang, self.tgt_lang) + ".lines.npy")
        if not path.is_file():
            raise DataError("line index missing; re-run preprocessing", path=str(path))
        return np.load(path, allow_pickle=False)

    def text(self, name: str, side: str = "tgt") -> list[str]:
        """The stripped input text of split `name` (valid/test only), e.g. BLEU references."""
        self._split_meta(name)
        if name not in self.scored_splits():
            raise DataError(
                f"input text is kept for {self.scored_splits()} only, not {name!r}",
                path=str(self.path),
            )
        path = self.path / (
            split_prefix(name, self.src_lang, self.tgt_lang, self.lang(side)) + ".txt"
        )
        if not path.is_file():
            raise DataError("reference text missing; re-run preprocessing", path=str(path))
        lines = path.read_text(encoding="utf-8").split("\n")[:-1]
        if len(lines) != self.meta["splits"][name]["sentences"]:
            raise DataError(
                "line count does not match meta.json; re-run preprocessing", path=str(path)
            )
        return lines

    def check(self) -> None:
        """Open every split (headers only) and compare it with meta.json; raise DataError if not."""
        for name in self.meta["splits"]:
            self.split(name)

    def describe_split(self, name: str) -> str:
        """Where split `name` comes from, for messages: its data-bin files, its input files and
        what preprocessing kept of them, e.g. `data-bin split /c/valid.de-en (from /d/valid.de,
        /d/valid.en: 0 input lines, 0 pairs kept, skipped: none)`."""
        info = self._split_meta(name)
        inputs = self.meta.get("inputs", {})
        files = [
            inputs.get(f"{name}.{lang}", {}).get("path") for lang in (self.src_lang, self.tgt_lang)
        ]
        skipped = ", ".join(f"{k} {n}" for k, n in info.get("skipped", {}).items()) or "none"
        prefix = self.path / split_prefix(name, self.src_lang, self.tgt_lang)
        return (
            f"data-bin split {prefix} (from {', '.join(str(f) for f in files if f)}: "
            f"{info.get('input_lines', '?')} input lines, {info['sentences']} pairs kept, "
            f"skipped: {skipped})"
        )

    def _split_meta(self, name: str) -> dict:
        splits = self.meta["splits"]
        if name not in splits:
            raise DataError(
                f"no split {name!r} in this data-bin (it has {sorted(splits)})", path=str(self.path)
            )
        return splits[name]

    def __getstate__(self) -> dict:
        # C++ models, as memory maps, are reopened lazily in the receiving process.
        return {**super().__getstate__(), "_segmenters": {}}
