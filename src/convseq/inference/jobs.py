"""What `task=generate` translates and how its output lines are made: a `Job` (a split of a
data-bin, or the lines of a text file), its translation by a predict Trainer, and the
hypothesis of every output line.

`convseq.tasks.generate` builds a split's job (it prepares the data-bin); the text-file job
(`input_job`: ``gen.input=FILE``, ``gen.reference=FILE``) is built here.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl

from convseq.data.base_databin import BaseDataBin
from convseq.data.textio import TextFile, read_text_file
from convseq.errors import DataError
from convseq.inference.data_match import check_given_data
from convseq.inference.generation import (
    BatchesFn,
    GenerationModule,
    SourceLines,
    encoded_batches,
    load_translator,
)
from convseq.inference.options import GenConfig
from convseq.inference.profiler import GenerationProfiler
from convseq.inference.records import best_texts
from convseq.inference.translator import Translator, numbered

__all__ = [
    "Job",
    "check_line_counts",
    "encode_lines",
    "input_job",
    "output_lines",
    "output_name",
    "read_input",
    "split_reference",
    "translate_job",
]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[\w.\-]+$")  # a file stem usable as it is in generate-<name>.txt


@dataclass
class Job:
    """What a generate run translates, and which output line each translated sentence fills."""

    name: str  # the files' <name>: the split, or gen.input's file stem
    translator: Translator
    batches: BatchesFn | None  # None: nothing to translate (every input line is empty)
    total: int  # output lines
    refs: list[str] | None  # None: no reference, no scores, no T- lines
    rows: list[int] | None = None  # output line (0-based) of each translated sentence; None: same
    about: dict[str, Any] = field(default_factory=dict)  # the JSON's account of the input

    @property
    def translated(self) -> int:
        return self.total if self.rows is None else len(self.rows)


def split_reference(reference: TextFile, databin: BaseDataBin, split: str, given: Any) -> list[str]:
    """``gen.reference``'s lines as the references of a fairseq data-bin's split (which holds
    ids only); convseq's own data-bin is scored against the text it kept, and refuses one."""
    if databin.keeps_text:
        raise DataError(
            f"gen.reference={given!r} is read only with gen.input=FILE or a fairseq data-bin "
            "(data.format=fairseq); a split of convseq's data-bin is scored against the "
            "reference text it kept"
        )
    n = len(databin.split(split)[1])
    if len(reference) != n:
        raise DataError(
            f"gen.reference has {len(reference)} lines but {databin.describe_split(split)} has "
            f"{n} sentences; line i of the reference must translate sentence i of the split",
            path=str(reference.path),
        )
    return list(reference.lines)


def input_job(
    ckpt: str | None, gen: GenConfig, accelerator: str, data: Mapping[str, Any] | None
) -> Job:
    """The lines of ``gen.input`` (and ``gen.reference``'s, if given) for the checkpoint(s)
    ``ckpt``; no data-bin is read. ``data``: a data config the user gave (as its plain record),
    which must be the model's though it is not read.

    The files are checked before the checkpoint is loaded, so a wrong path fails at once.
    """
    source = read_input(gen.input, "gen.input")
    if not source.lines:
        raise DataError("gen.input is empty: no line to translate", path=str(source.path))
    refs, ref_path = None, None
    if gen.reference:
        reference = read_input(gen.reference, "gen.reference")
        check_line_counts(source, reference)
        refs, ref_path = reference.lines, str(reference.path)
    # the checkpoint's own segmentation
    translator = load_translator(ckpt, gen, accelerator)
    if data is not None:  # given, though unused: it must still be the model's
        check_given_data(translator.trained_on, data)
    encoded, rows = encode_lines(translator, source)
    batches = None
    if encoded:
        where = SourceLines(str(source.path), [r + 1 for r in rows])
        batches = encoded_batches(translator, encoded, gen, str(source.path), where)
    about = {
        "input": str(source.path),
        "reference": ref_path,
        "empty_lines": len(source) - len(rows),
    }
    return Job(output_name(source.path), translator, batches, len(source), refs, rows, about)


def read_input(value: Any, key: str) -> TextFile:
    """The stripped lines of the text file ``key`` names (UTF-8 checked, with file:line)."""
    path = Path(str(value)).expanduser()
    if path.is_dir():
        raise DataError(
            f"{key} names a folder; give a text file, one sentence per line", path=str(path)
        )
    if not path.is_file():
        raise DataError(
            f"{key}: no such file; give a text file, one sentence per line (a relative path "
            "starts from the folder run.py is started in)",
            path=str(path),
        )
    return read_text_file(path, strip=True)


def check_line_counts(source: TextFile, reference: TextFile) -> None:
    """Line i of the reference must translate line i of the input: the counts must agree."""
    if len(reference) == len(source):
        return
    shorter, longer = sorted((source, reference), key=len)
    raise DataError(
        f"gen.reference has {len(reference)} lines but gen.input {source.path} has "
        f"{len(source)}: line {len(shorter) + 1} of {longer.path} has no counterpart in "
        f"{shorter.path}; line i of the reference must translate line i of the input",
        path=str(reference.path),
    )


def encode_lines(translator: Translator, text: TextFile) -> tuple[list[np.ndarray], list[int]]:
    """The ids of the non-empty lines and their 0-based line indices.

    Empty lines are not translated (their hypothesis is an empty line, as in task=interactive);
    over-long lines are truncated to the model's source positions. Both are reported with
    their line numbers.
    """
    rows = [i for i, line in enumerate(text.lines) if line]
    empty = [i + 1 for i, line in enumerate(text.lines) if not line]
    if empty:
        log.warning(
            "%s: %d empty line(s) (%s): nothing to translate, their hypotheses are empty lines",
            text.path,
            len(empty),
            numbered("line", empty),
        )

    def what(cut: list[int]) -> str:
        return f"{text.path}: {len(cut)} line(s) ({numbered('line', [rows[i] + 1 for i in cut])})"

    encoded, _ = translator.encode_lines((text.lines[i] for i in rows), what)
    return encoded, rows


def output_name(path: Path) -> str:
    """``generate-<name>.*``: the input file's stem, or ``input`` when it is unusable as a name."""
    return path.stem if _NAME.match(path.stem) else "input"


def translate_job(
    job: Job, trainer: pl.Trainer, profiler: GenerationProfiler | None
) -> tuple[list[dict], list[int]]:
    """(records of the translated sentences in input order, sentences per rank), on every rank."""
    if job.batches is None:
        return [], []
    module = GenerationModule(job.translator, job.translator.options, job.batches, profiler)
    # batch_loader's sampler yields every index exactly once (shuffle off, nothing dropped)
    warnings.filterwarnings("ignore", message="You are using a custom batch sampler")
    # each rank translates its share; the module gathers every record, in input order
    trainer.predict(module, return_predictions=False)
    return module.records, module.sentences_per_rank


def output_lines(job: Job, records: list[dict]) -> tuple[list[str], list[dict], list[dict]]:
    """(hypothesis of every output line, translated records, records of every line).

    The records' ids become output lines; an empty input line gets an empty hypothesis and a
    record without hypotheses (its n-best entry: the S- line, and T- with a reference).
    """
    texts = best_texts(records, job.translated)  # checks that none is missing
    if job.rows is None:
        return texts, records, records
    hyps = [""] * job.total
    placed = []
    for record, text in zip(records, texts):
        row = job.rows[record["id"]]
        hyps[row] = text
        placed.append({**record, "id": row})
    eos = job.translator.src_dict[job.translator.src_dict.eos()]
    empty = [
        {"id": i, "src_symbols": [eos], "hypotheses": []}
        for i in sorted(set(range(job.total)) - set(job.rows))
    ]
    return hyps, placed, sorted(placed + empty, key=lambda r: r["id"])
