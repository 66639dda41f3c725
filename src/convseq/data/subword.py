"""Sentence segmentation: whitespace tokens, or sentencepiece (BPE or unigram) trained on train.

A `Segmenter` turns a stripped line into a list of token strings and back. The sentencepiece
model emits pieces as strings; convseq's own `Dictionary` then maps pieces to ids, so the
dictionary stays in fairseq's dict.txt format whatever the segmentation.

convseq checkpoints carry the segmentation of their training data (`text_processing`, saved
under `convseq.checkpoints.io.TEXT_KEY`; read back by `segmenters`), so that raw text can be
translated from the checkpoint alone, without the data-bin.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from convseq.errors import DataError

SUBWORD_TYPES = ("none", "bpe", "unigram")
# How pieces of an outside segmentation become text again (fairseq's --remove-bpe values):
# `data.remove_bpe` of a fairseq data-bin, whose text was segmented before fairseq-preprocess.
REMOVE_BPE = ("none", "subword_nmt", "@@ ", "sentencepiece")
SPM_SPACE = "\u2581"  # sentencepiece's word-start mark
SAMPLE_BLOCK = 1 << 16  # sentences per block of the sampling draw (part of what a seed draws)


def check_remove_bpe(value: str | None) -> str | None:
    """`data.remove_bpe` checked: one of `REMOVE_BPE`, or None (same as "none")."""
    if value is None or value == "none":
        return None
    if value not in REMOVE_BPE:
        raise DataError(
            f"data.remove_bpe={value!r}: use one of {', '.join(map(repr, REMOVE_BPE))} (fairseq's "
            "--remove-bpe values: how the data-bin's subword pieces are joined back into text)"
        )
    return value


def undo_segmentation(text: str, how: str | None) -> str:
    """`text` (pieces joined by spaces) with the subword segmentation `how` undone.

    subword_nmt / "@@ ": a piece ending in "@@" continues into the next one; sentencepiece:
    spaces go and each word-start mark becomes a space.
    """
    if how is None or how == "none":
        return text
    if how in ("subword_nmt", "@@ "):
        return (text + " ").replace("@@ ", "").rstrip()
    if how == "sentencepiece":
        return text.replace(" ", "").replace(SPM_SPACE, " ").strip()
    raise DataError(f"remove_bpe={how!r}: use one of {REMOVE_BPE}")


class Segmenter:
    """Whitespace segmentation (`model is None`) or a trained sentencepiece model.

    `remove_bpe` (whitespace only): the text was segmented before it reached convseq (a fairseq
    data-bin); `detokenize` undoes it (`undo_segmentation`), `segment` expects it done.
    """

    def __init__(
        self,
        model: spm.SentencePieceProcessor | None = None,
        num_threads: int = 2,
        remove_bpe: str | None = None,
    ):
        self.model = model
        self.num_threads = num_threads
        self.remove_bpe = check_remove_bpe(remove_bpe)

    @classmethod
    def load(cls, path: str | os.PathLike | None) -> Segmenter:
        """A Segmenter from a `.model` file (None: whitespace tokens)."""
        if path is None:
            return cls(None)
        path = Path(path)
        if not path.is_file():
            raise DataError("sentencepiece model missing; re-run preprocessing", path=str(path))
        try:
            return cls(spm.SentencePieceProcessor(model_file=str(path)))
        except (RuntimeError, OSError) as e:
            raise DataError(
                f"cannot load sentencepiece model ({e}); delete the data-bin and re-run preprocessing",
                path=str(path),
            ) from e

    @classmethod
    def from_proto(cls, proto: bytes | None, num_threads: int = 2) -> Segmenter:
        """A Segmenter from a serialized sentencepiece model (None: whitespace tokens)."""
        model = None if proto is None else spm.SentencePieceProcessor(model_proto=proto)
        return cls(model, num_threads)

    def to_proto(self) -> bytes | None:
        """The serialized sentencepiece model, or None for whitespace tokens."""
        return None if self.model is None else bytes(self.model.serialized_model_proto())

    def segment(self, line: str) -> list[str]:
        """The tokens of one (stripped) line."""
        if self.model is None:
            return line.split()
        return self.model.encode(line, out_type=str)

    def segment_many(self, lines: Sequence[str]) -> list[list[str]]:
        """The tokens of many lines (sentencepiece encodes a batch with several threads)."""
        if self.model is None:
            return [ln.split() for ln in lines]
        return self.model.encode(list(lines), out_type=str, num_threads=self.num_threads)

    def detokenize(self, tokens: Sequence[str]) -> str:
        """Text from tokens: pieces are joined back with sentencepiece, words with spaces."""
        if self.model is None:
            return undo_segmentation(" ".join(tokens), self.remove_bpe)
        return self.model.decode_pieces(list(tokens))

    def __getstate__(self) -> dict:
        # A SentencePieceProcessor is a C++ object: ship its serialized model to worker processes.
        return {
            "proto": self.to_proto(),
            "num_threads": self.num_threads,
            "remove_bpe": self.remove_bpe,
        }

    def __setstate__(self, state: dict) -> None:
        self.num_threads = state["num_threads"]
        self.model = Segmenter.from_proto(state["proto"]).model
        self.remove_bpe = state.get("remove_bpe")


def text_processing(src_lang: str, tgt_lang: str, src: Segmenter, tgt: Segmenter) -> dict:
    """A checkpoint's segmentation entry: languages and serialized sentencepiece models (or None).

    Plain values and bytes only, so checkpoints stay loadable with ``weights_only=True``.
    A segmentation done outside convseq (a fairseq data-bin's) adds ``remove_bpe``.
    """
    entry = {
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
        "src_spm": src.to_proto(),
        "tgt_spm": tgt.to_proto(),
    }
    if tgt.remove_bpe is not None:
        entry["remove_bpe"] = tgt.remove_bpe
    return entry


def segmenters(info: Mapping[str, Any] | None) -> tuple[Segmenter, Segmenter]:
    """(source, target) segmenters of a `text_processing` entry; whitespace when absent."""
    info = info or {}
    how = info.get("remove_bpe")
    src, tgt = (Segmenter.from_proto(info.get(key)).model for key in ("src_spm", "tgt_spm"))
    return Segmenter(src, remove_bpe=how), Segmenter(tgt, remove_bpe=how)


def sample_sentences(
    sentences: Iterable[str], total: int, size: int, seed: int = 1
) -> Iterator[str]:
    """`size` of the `total` sentences, drawn uniformly at random and yielded in input order.

    Streams: the draw is made block by block (how many of a block's sentences are drawn follows
    the hypergeometric law of the sentences still to draw, then which ones is a uniform choice),
    so memory holds one block of flags, never the corpus. The same `seed`, `total` and `size`
    always draw the same sentences: numpy's legacy `RandomState`, whose streams are frozen across
    numpy versions, makes the draws.
    """
    rng = np.random.RandomState(seed)
    left, todo = total, min(size, total)
    it = iter(sentences)
    while left > 0:
        n = min(SAMPLE_BLOCK, left)
        take = np.zeros(n, dtype=bool)
        if todo > 0:
            k = int(rng.hypergeometric(n, left - n, todo)) if todo < left else n
            if k:
                take[rng.choice(n, k, replace=False)] = True
            todo -= k
        for chosen, sentence in zip(take, islice(it, n)):
            if chosen:
                yield sentence
        left -= n


def train_sentencepiece(
    sentences: Iterable[str],
    model_path: str | os.PathLike,
    model_type: str,
    vocab_size: int,
    character_coverage: float = 1.0,
    input_sentence_size: int = 0,
    seed: int = 1,
    num_threads: int = 2,
    num_sentences: int | None = None,
) -> Segmenter:
    """Train a sentencepiece model on `sentences`, write it to `model_path`, return it.

    `vocab_size` is an upper bound (sentencepiece's `hard_vocab_limit=false`): a corpus too small
    for it gets the largest vocabulary it supports instead of an error. No BOS/EOS pieces are
    reserved: convseq's dictionary adds its own specials. Logging is silenced (`minloglevel`).
    `sentences` is read once, as a stream: an iterator over a file is never held in memory.

    With `input_sentence_size > 0` and more sentences than that, the model is trained on a random
    sample of `input_sentence_size` of them, drawn with `seed` by `sample_sentences` (the count
    of an iterator is `num_sentences`). Sentencepiece's own sampling (`shuffle_input_sentence`)
    is not used for the draw: in sentencepiece 0.2 it gives another model at every run, whatever
    `set_random_generator_seed` says. It still receives `input_sentence_size`, which its model
    file records, and keeps every one of the at most that many sentences it is given.
    """
    if model_type not in ("bpe", "unigram"):
        raise DataError(f"data.subword.type must be one of {SUBWORD_TYPES}, got {model_type!r}")
    if vocab_size < 2:
        raise DataError(f"data.subword.vocab_size must be >= 2, got {vocab_size}")
    stream = _training_stream(sentences, input_sentence_size, seed, num_sentences)
    proto = _train_model(
        stream,
        model_path,
        model_type,
        vocab_size,
        character_coverage,
        input_sentence_size,
        num_threads,
    )
    tmp = Path(str(model_path) + ".tmp")
    tmp.write_bytes(proto)
    os.replace(tmp, model_path)
    return Segmenter(spm.SentencePieceProcessor(model_proto=proto), num_threads=num_threads)


def _training_stream(
    sentences: Iterable[str], input_sentence_size: int, seed: int, num_sentences: int | None
) -> Iterator[str]:
    """The non-empty sentences sentencepiece is given: with `input_sentence_size > 0` and more
    sentences than that, `sample_sentences`' draw of them (sentencepiece's generator seeded too).

    Raises:
        DataError: no non-empty sentence is left.
    """
    if input_sentence_size > 0:
        spm.set_random_generator_seed(seed)
        if num_sentences is None and not isinstance(sentences, Sized):
            raise ValueError("sampling sentences from an iterator needs num_sentences")
        total = len(sentences) if num_sentences is None else num_sentences  # type: ignore[arg-type]
        if total > input_sentence_size:
            sentences = sample_sentences(sentences, total, input_sentence_size, seed)
    nonempty = (s for s in sentences if s)
    first = next(nonempty, None)
    if first is None:
        raise DataError("no non-empty training sentence to train sentencepiece on")
    return chain([first], nonempty)


def _train_model(
    sentences: Iterator[str],
    model_path: str | os.PathLike,
    model_type: str,
    vocab_size: int,
    character_coverage: float,
    input_sentence_size: int,
    num_threads: int,
) -> bytes:
    """sentencepiece's trainer run on `sentences`; the model file's bytes (the file is
    `model_path`, named in the error of a failed training)."""
    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences,
            model_writer=buffer,
            model_type=model_type,
            vocab_size=vocab_size,
            hard_vocab_limit=False,
            character_coverage=character_coverage,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=input_sentence_size > 0,
            bos_id=-1,
            eos_id=-1,
            pad_id=-1,
            unk_id=0,
            # Long sentences are kept (the default 4192 bytes would silently drop them).
            max_sentence_length=1 << 20,
            num_threads=num_threads,
            minloglevel=2,  # warnings and info would flood the console
        )
    except RuntimeError as e:
        raise DataError(f"sentencepiece training failed: {e}", path=str(model_path)) from e
    return buffer.getvalue()
