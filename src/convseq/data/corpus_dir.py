"""Which folder a data config reads its text from, and where a corpus generator writes.

The rule: `data.dir` names a folder of text that is read and never written. With `dir` unset
(null) and a `generator` (the toy group: `data.generator=toy`), the generator writes the corpus
into its own folder in the cache, `<paths.cache_dir>/corpora/<generator>-seed<generator_seed>`,
and that folder is read. A `dir` the user names is read as it is: the generator does not run, so
`python run.py data.dir=MY_CORPUS data.src_lang=de data.tgt_lang=en` reads MY_CORPUS and writes
nothing into it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from convseq.data.config import DataConfig
from convseq.errors import DataError

__all__ = ["generated_dir", "with_corpus_dir"]


def generated_dir(cache_dir: str | Path, generator: str, seed: int) -> Path:
    """The generator's own folder in the cache: `<cache_dir>/corpora/<generator>-seed<seed>`."""
    return Path(cache_dir).expanduser().absolute() / "corpora" / f"{generator}-seed{seed}"


def with_corpus_dir(cfg: DataConfig, cache_dir: str | Path) -> DataConfig:
    """`cfg` with `dir` the absolute folder to read: the given `dir` as it is, or, unset, the
    generator's folder in `cache_dir`, where the corpus is written first if it is not there.

    Raises:
        DataError: `dir` is unset and there is no generator.
    """
    if cfg.dir:
        return dataclasses.replace(cfg, dir=str(Path(cfg.dir).expanduser().absolute()))
    if not cfg.generator:
        raise DataError(
            "data.dir is unset: give the folder that holds the corpus text with data.dir=FOLDER"
        )
    folder = generated_dir(cache_dir, cfg.generator, cfg.generator_seed)
    # imported lazily: the toy grammar is only needed when the corpus is generated
    from convseq.data.toy.corpus import write_toy_corpus

    write_toy_corpus(folder, seed=cfg.generator_seed)
    return dataclasses.replace(cfg, dir=str(folder))
