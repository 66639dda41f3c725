"""`BaseDataBin`: what every data-bin offers, and the code its kinds share.

A data-bin is a finished, binarised corpus: two dictionaries, the token arrays of each split and
the text to score generation against. convseq reads two kinds, which implement this interface:
its own (`convseq.data.databin.DataBin`, built by `convseq.data.preprocess`) and a folder
written by fairseq-preprocess (`convseq.data.fairseq_databin.FairseqDataBin`). Training,
validation, BLEU and generation take a `BaseDataBin` and never ask which kind it is: what
differs is a method or property here (`keeps_text`, `has_split`, `sizes`, ...).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from convseq.data.dictionary import Dictionary
from convseq.data.indexed import TokenArray
from convseq.data.subword import Segmenter, text_processing

TEXT_SPLITS = ("valid", "test")  # splits whose input text is kept for scoring (and data.test_sets)


class BaseDataBin(ABC):
    """A data-bin: dictionaries, splits, reference text, segmentation.

    A subclass sets `path`, `src_lang`, `tgt_lang`, `src_dict`, `tgt_dict` and `_splits` (the
    split cache, emptied when pickled) in its `__init__`, and implements the abstract methods.
    """

    path: Path
    src_lang: str
    tgt_lang: str
    src_dict: Dictionary
    tgt_dict: Dictionary
    _splits: dict[str, tuple[TokenArray, TokenArray]]

    # -- dictionaries and segmentation ----------------------------------------------------------
    def lang(self, side: str) -> str:
        """The language code of `side` ("src" or "tgt")."""
        if side not in ("src", "tgt"):
            raise ValueError(f"side must be 'src' or 'tgt', got {side!r}")
        return self.src_lang if side == "src" else self.tgt_lang

    def dictionary(self, side: str) -> Dictionary:
        """The dictionary of `side` ("src" or "tgt")."""
        self.lang(side)  # validates `side`
        return self.src_dict if side == "src" else self.tgt_dict

    @abstractmethod
    def segmenter(self, side: str) -> Segmenter:
        """The segmenter of `side`: how its text became the dictionary's pieces, and back."""

    def text_processing(self) -> dict:
        """The checkpoints' segmentation entry of this data (`convseq.data.subword.text_processing`)."""
        return text_processing(
            self.src_lang, self.tgt_lang, self.segmenter("src"), self.segmenter("tgt")
        )

    def decode(self, ids, side: str = "tgt") -> str:
        """Text of ids: specials (pad, EOS, BOS) dropped, subword segmentation undone."""
        tokens = self.dictionary(side).string(ids, strip_special=True).split()
        return self.segmenter(side).detokenize(tokens)

    # -- splits ---------------------------------------------------------------------------------
    @property
    @abstractmethod
    def test_sets(self) -> list[str]:
        """The extra evaluation sets (`data.test_sets`), in the order the config named them."""

    @property
    @abstractmethod
    def keeps_text(self) -> bool:
        """Whether the input text of the scored splits was kept: BLEU references are read from
        it. False: the references are the target ids joined back into text (`text`)."""

    def scored_splits(self) -> list[str]:
        """The splits generation may score: valid, test and the extra test sets."""
        return [*TEXT_SPLITS, *self.test_sets]

    @abstractmethod
    def has_split(self, name: str) -> bool:
        """Whether the data-bin holds split `name` (a role or an extra test set)."""

    @abstractmethod
    def split(self, name: str) -> tuple[TokenArray, TokenArray]:
        """The (source, target) token arrays of split `name` (train, valid or test)."""

    @abstractmethod
    def lines(self, name: str) -> np.ndarray:
        """0-based input line of each sentence of split `name` (tells which lines were skipped)."""

    @abstractmethod
    def text(self, name: str, side: str = "tgt") -> list[str]:
        """The reference text of split `name` on `side`, one line a sentence."""

    @abstractmethod
    def check(self) -> None:
        """Open every split and check its files; raise DataError if one is damaged."""

    @abstractmethod
    def describe_split(self, name: str) -> str:
        """Where split `name` comes from, for messages."""

    @abstractmethod
    def sizes(self) -> dict[str, Any]:
        """Languages and per-split counts for a run's header: `src_lang`, `tgt_lang` and
        `splits` (split -> `{"sentences": n, ...}`, the splits the data-bin holds)."""

    def __getstate__(self) -> dict:
        # Memory maps are reopened lazily in the receiving process.
        return {**self.__dict__, "_splits": {}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, {self.src_lang}->{self.tgt_lang})"
