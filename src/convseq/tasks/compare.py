"""`task=compare`: is one system's BLEU really better? Paired bootstrap over run folders.

    python run.py task=compare experiment=multi30k_compare \
        compare.runs=[multirun/2026-12-03/10-00-00/0,multirun/2026-12-03/10-00-00/3]
    python run.py task=compare compare.runs=[a/generate-test.txt,b/generate-test.txt] \
        compare.refs=../shared/data/multi30k/test.en

Each entry of ``compare.runs`` is a run folder (its ``generate-<compare.split>.txt``: the best
checkpoint's test translations that training writes, or what ``task=generate`` wrote there) or a
hypothesis file, one detokenised sentence per line. The first is the baseline. The references
are ``compare.refs``, else the split's reference text in the data-bin of the composed ``data``
(pass the runs' ``experiment=``/``data=`` settings, as for ``task=generate``).

For every system (`convseq.evaluation.bootstrap`): corpus BLEU (sacreBLEU, tokenizer ``gen.tokenize``), the mean and the 95%
confidence half-width over ``compare.n_samples`` bootstrap resamples of the test sentences, and,
against the baseline, the p-value of sacreBLEU's paired bootstrap test (Koehn 2004, as Moses'
``bootstrap-hypothesis-difference-significance.pl``): the same resampled sentence sets score both
systems, and p is the share of resamples whose (centred) difference is at least the observed
one. Where there is nothing to test, a system gets p = 1 and a note instead of the test's p:
translations equal to the baseline's line for line ("identical"), the baseline's corpus BLEU
("same BLEU", as equal sentence-level statistics give), or a one-sentence test set ("one
sentence"); sacreBLEU's formula would return its smallest value, 1 / (n_samples + 1), and call
two systems that both score 0.00 significantly different.

The table is printed and written with the raw figures to ``<output_dir>/compare.json``.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from convseq.common.config import plain
from convseq.data.preprocess import open_databin
from convseq.errors import DataError
from convseq.evaluation.bootstrap import (
    ALPHA,
    COMPARE_FILE,
    SystemResult,
    format_table,
    hypothesis_file,
    paired_bootstrap,
    read_lines,
)
from convseq.tasks.config import CompareTaskConfig

__all__ = ["run_compare"]


def _references(cfg: CompareTaskConfig, split: str) -> tuple[list[str], str]:
    """The reference lines and where they come from: compare.refs, else the data-bin's text."""
    refs = cfg.compare.refs
    if refs:
        lines = read_lines(refs)
        if not lines:
            raise DataError(
                "the reference file is empty: compare.refs takes the split's target text",
                path=str(refs),
            )
        return lines, str(refs)
    if not cfg.data:
        raise DataError(
            "task=compare scores against compare.refs=FILE or the split of a corpus "
            "(data=NAME): give one of them"
        )
    databin = open_databin(plain(cfg.data), cfg.paths.cache_dir)
    return databin.text(split, "tgt"), f"{databin.path} ({split} references)"


def run_compare(cfg: CompareTaskConfig) -> list[SystemResult]:
    """`python run.py task=compare compare.runs=[...]`: see the module docstring."""
    opts = cfg.compare
    split = opts.split
    runs = [str(r) for r in opts.runs]
    if len(runs) < 2:
        raise DataError(
            f"task=compare needs compare.runs=[BASELINE,OTHER,...] with at least two run folders "
            f"or hypothesis files, got {runs}"
        )
    paths = [hypothesis_file(r, split) for r in runs]  # every missing file fails before reading
    systems = [(name, read_lines(p)) for name, p in zip(runs, paths)]
    refs, refs_from = _references(cfg, split)
    results, signature = paired_bootstrap(
        systems,
        refs,
        n_samples=opts.n_samples,
        seed=opts.seed,
        tokenize=cfg.gen.tokenize,
        paths=[str(p) for p in paths],
    )
    table = format_table(results, signature)
    print(table)
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "split": split,
        "references": refs_from,
        "signature": signature,
        "alpha": ALPHA,
        "systems": [asdict(r) | {"significant": r.significant} for r in results],
    }
    (out_dir / COMPARE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"convseq: comparison written to {out_dir / COMPARE_FILE}", flush=True)
    return results
