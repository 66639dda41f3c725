"""Sentence segmentation: whitespace tokens, or sentencepiece (BPE or unigram) trained on train.

A `Segmenter` turns a stripped line into a list of token strings and back. The sentencepiece
model emits pieces as strings; convseq's own `Dictionary` then maps pieces to ids, so the
dictionary stays in fairseq's dict.txt format whatever the segmentation.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from convseq.errors import DataError

SUBWORD_TYPES = ("none", "bpe", "unigram")


class Segmenter:
    """Whitespace segmentation (`model is None`) or a trained sentencepiece model."""

    def __init__(self, model: spm.SentencePieceProcessor | None = None, num_threads: int = 2):
        self.model = model
        self.num_threads = num_threads

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
            return " ".join(tokens)
        return self.model.decode_pieces(list(tokens))

    def __getstate__(self) -> dict:
        # A SentencePieceProcessor is a C++ object: ship its serialized model to worker processes.
        proto = self.model.serialized_model_proto() if self.model is not None else None
        return {"proto": proto, "num_threads": self.num_threads}

    def __setstate__(self, state: dict) -> None:
        self.num_threads = state["num_threads"]
        proto = state["proto"]
        self.model = spm.SentencePieceProcessor(model_proto=proto) if proto is not None else None


def train_sentencepiece(
    sentences: Iterable[str],
    model_path: str | os.PathLike,
    model_type: str,
    vocab_size: int,
    character_coverage: float = 1.0,
    input_sentence_size: int = 0,
    seed: int = 1,
    num_threads: int = 2,
) -> Segmenter:
    """Train a sentencepiece model on `sentences`, write it to `model_path`, return it.

    `vocab_size` is an upper bound (sentencepiece's `hard_vocab_limit=false`): a corpus too small
    for it gets the largest vocabulary it supports instead of an error. No BOS/EOS pieces are
    reserved: convseq's dictionary adds its own specials. Logging is silenced (`minloglevel`).
    """
    if model_type not in ("bpe", "unigram"):
        raise DataError(f"data.subword.type must be one of {SUBWORD_TYPES}, got {model_type!r}")
    if vocab_size < 2:
        raise DataError(f"data.subword.vocab_size must be >= 2, got {vocab_size}")
    if input_sentence_size > 0:
        # Sampling the training sentences is random: pin it so the same inputs give the same model.
        spm.set_random_generator_seed(seed)
    sentences = [s for s in sentences if s]
    if not sentences:
        raise DataError("no non-empty training sentence to train sentencepiece on")
    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
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
    proto = buffer.getvalue()
    tmp = Path(str(model_path) + ".tmp")
    tmp.write_bytes(proto)
    os.replace(tmp, model_path)
    return Segmenter(spm.SentencePieceProcessor(model_proto=proto), num_threads=num_threads)
