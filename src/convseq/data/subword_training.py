"""Step 2 of building a data-bin (`convseq.data.binarize`): the sentencepiece models.

`train_segmenters` trains each language's model (or one joint model) on the kept train
sentences, streamed from the input files, and writes it into the data-bin; `trains_on_sample`
says whether a model sees a seeded sample of them (`data.subword.input_sentence_size`) rather
than all.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import chain, compress
from pathlib import Path

import numpy as np

from convseq.data.config import DataConfig
from convseq.data.subword import Segmenter, train_sentencepiece
from convseq.data.textio import TextStream

SPM_THREADS = 2  # sentencepiece threads in this process (part of the model file: keep fixed)


def trains_on_sample(cfg: DataConfig, n_src: int, n_tgt: int) -> bool:
    """Whether a sentencepiece model would be trained on a sample of its sentences."""
    size = cfg.subword.input_sentence_size
    inputs = [n_src + n_tgt] if cfg.subword.joint else [n_src, n_tgt]
    return size > 0 and max(inputs) > size


def _kept_lines(path: Path, sha256: str, mask: np.ndarray) -> Iterator[str]:
    """The stripped lines of a file whose flag in `mask` is set, streamed."""
    first = 0
    for block in TextStream(path, expect_sha256=sha256):
        yield from compress(block, mask[first : first + len(block)].tolist())
        first += len(block)


def train_segmenters(
    cfg: DataConfig, paths: Mapping, sha: Mapping, mask: np.ndarray, out: Path
) -> tuple[dict[str, Segmenter], dict[str, str], dict[str, int]]:
    """Segmenters per language (sentencepiece trained on the kept train pairs), their model file
    names, and how many sentences each model was trained on."""
    src, tgt = cfg.src_lang, cfg.tgt_lang
    sub = cfg.subword
    if sub.type == "none":
        return {src: Segmenter(None), tgt: Segmenter(None)}, {}, {}
    kept = int(mask.sum())  # kept train lines are never empty: both sides have `kept` sentences
    options = dict(
        model_type=sub.type,
        vocab_size=sub.vocab_size,
        character_coverage=sub.character_coverage,
        num_threads=SPM_THREADS,
    )

    def lines(side: str) -> Iterator[str]:
        return _kept_lines(paths["train", side], sha["train", side], mask)

    if sub.joint:
        n = 2 * kept
        size = sub.input_sentence_size if trains_on_sample(cfg, kept, kept) else 0
        stream = chain(lines("src"), lines("tgt"))
        seg = train_sentencepiece(
            stream, out / "spm.model", input_sentence_size=size, num_sentences=n, **options
        )
        return {src: seg, tgt: seg}, {src: "spm.model", tgt: "spm.model"}, {"spm.model": size or n}
    segs, models, used = {}, {}, {}
    size = sub.input_sentence_size if trains_on_sample(cfg, kept, kept) else 0
    for lang, side in ((src, "src"), (tgt, "tgt")):
        models[lang] = f"spm.{lang}.model"
        segs[lang] = train_sentencepiece(
            lines(side), out / models[lang], input_sentence_size=size, num_sentences=kept, **options
        )
        used[models[lang]] = size or kept
    return segs, models, used
