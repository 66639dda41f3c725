"""Is one system's BLEU really better? Paired bootstrap resampling with sacreBLEU.

For every system: corpus BLEU (sacreBLEU, tokenizer ``gen.tokenize``), the mean and the 95%
confidence half-width over ``n_samples`` bootstrap resamples of the test sentences, and,
against the baseline (the first system), the p-value of sacreBLEU's paired bootstrap test
(Koehn 2004, as Moses' ``bootstrap-hypothesis-difference-significance.pl``): the same resampled
sentence sets score both systems, and p is the share of resamples whose (centred) difference is
at least the observed one.

Where the test has nothing to measure, a system gets p = 1 (not significant) and a note saying
why: its translations equal the baseline's line for line ("identical"), its corpus BLEU equals
the baseline's ("same BLEU": no observed difference; equal sentence-level statistics always give
it, and then every resample gives the same difference, 0), or the test set is one sentence ("one
sentence": every resample is that sentence). sacreBLEU's formula would return its smallest
value, 1 / (n_samples + 1), in the degenerate ones: it counts the resamples whose centred
difference is strictly above the observed one, and a constant difference leaves none.

`task=compare` (`convseq.tasks.compare`) runs it over run folders or hypothesis files.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from convseq.errors import DataError

__all__ = [
    "SystemResult",
    "format_table",
    "hypothesis_file",
    "paired_bootstrap",
    "read_lines",
]

COMPARE_FILE = "compare.json"
ALPHA = 0.05  # the significance level the table marks


@dataclass(frozen=True)
class SystemResult:
    """One system's figures.

    Attributes:
        name: how the table names it (its run folder or file, as given).
        path: the hypothesis file read.
        bleu: corpus BLEU on all sentences.
        mean: mean BLEU over the bootstrap resamples.
        ci: half-width of the 95% confidence interval around `mean`.
        p_value: paired bootstrap p-value against the baseline (None for the baseline).
        identical: its translations equal the baseline's line for line.
        note: why `p_value` is 1 without a test ("identical", "same BLEU", "one sentence"), or
            "" when the paired test gave it.
    """

    name: str
    path: str
    bleu: float
    mean: float
    ci: float
    p_value: float | None
    identical: bool = False
    note: str = ""

    @property
    def significant(self) -> bool:
        """Whether it differs from the baseline at level `ALPHA`."""
        return self.p_value is not None and self.p_value < ALPHA


def hypothesis_file(entry: str | os.PathLike, split: str = "test") -> Path:
    """The hypothesis file of a `compare.runs` entry: a file, or a run folder's generate file.

    Raises:
        DataError: it does not exist, or the folder holds no ``generate-<split>.txt``.
    """
    path = Path(entry)
    if path.is_dir():
        found = path / f"generate-{split}.txt"
        if not found.is_file():
            raise DataError(
                f"no generate-{split}.txt in this run folder: training writes it after the final "
                f"test (gen.test_bleu=true); otherwise run task=generate ckpt={path}/checkpoints/"
                f"best.ckpt gen.split={split} gen.output={path}",
                path=str(path),
            )
        return found
    if not path.is_file():
        raise DataError(
            "no such run folder or hypothesis file (compare.runs takes run folders or files)",
            path=str(path),
        )
    return path


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file, without their line ends (a last newline is optional).

    Raises:
        DataError: the file is missing, unreadable or not UTF-8.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise DataError("file not found", path=str(path)) from e
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 text ({e.reason} at byte {e.start})", path=str(path)) from e
    except OSError as e:
        raise DataError(f"cannot read it: {e.strerror}", path=str(path)) from e
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line.rstrip("\r") for line in lines]


@contextmanager
def _sacrebleu_seed(seed: int) -> Iterator[None]:
    """sacreBLEU reads its resampling seed from $SACREBLEU_SEED; set it for one test."""
    old = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if old is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = old


def paired_bootstrap(
    systems: Sequence[tuple[str, Sequence[str]]],
    references: Sequence[str],
    n_samples: int = 1000,
    seed: int = 12345,
    tokenize: str = "13a",
    paths: Sequence[str] | None = None,
) -> tuple[list[SystemResult], str]:
    """BLEU, its 95% CI and the paired bootstrap p-value of each system against the first.

    Args:
        systems: (name, hypotheses) pairs, the baseline first; hypotheses in reference order.
        references: one reference per line.
        n_samples: bootstrap resamples (sacreBLEU's default 1000).
        seed: the resampling seed (>= 1; the same seed gives the same resamples).
        tokenize: sacreBLEU's tokenizer.
        paths: the files the hypotheses came from (default: the names), for messages.

    Returns:
        The results in the order given, and sacreBLEU's signature of the test.

    Raises:
        DataError: fewer than two systems, no reference, or a system whose line count differs
            from the references' (named by its file).
    """
    names = [name for name, _ in systems]
    files = list(paths) if paths is not None else names
    _check_systems(systems, references, n_samples, seed, files)
    hyp_lists = [[str(h) for h in hyps] for _, hyps in systems]
    refs = [[str(r) for r in references]]
    with _sacrebleu_seed(seed):
        test = PairedTest(
            list(zip(names, hyp_lists)),
            {"BLEU": BLEU(tokenize=tokenize)},
            references=refs,
            test_type="bs",
            n_samples=n_samples,
        )
        signatures, scores = test()
    key = next(k for k in scores if k != "System")
    return _results(scores[key], names, files, hyp_lists), f"BLEU|{signatures[key]}"


def _check_systems(
    systems: Sequence[tuple[str, Sequence[str]]],
    references: Sequence[str],
    n_samples: int,
    seed: int,
    files: Sequence[str],
) -> None:
    """Refuse fewer than two systems, no reference, a bad count or seed, or a system whose line
    count differs from the references' (named by its file)."""
    if len(systems) < 2:
        raise DataError(
            f"compare needs at least two systems (the baseline first), got {len(systems)}: "
            "list them in compare.runs=[BASELINE,OTHER,...]"
        )
    if not references:
        raise DataError("no reference line to compare against")
    if n_samples < 1 or seed < 1:
        raise DataError(f"compare.n_samples and compare.seed must be >= 1, got {n_samples}, {seed}")
    for (_, hyps), path in zip(systems, files):
        if not hyps:
            raise DataError(
                f"the hypothesis file is empty, for {len(references)} reference lines: "
                "translate the split first (task=generate gen.split=... gen.output=...)",
                path=str(path),
            )
        if len(hyps) != len(references):
            raise DataError(
                f"{len(hyps)} hypotheses for {len(references)} reference lines: each system "
                "needs one translation per reference line (the same split, in its order)",
                path=str(path),
            )


def _results(
    scores: Sequence[Any], names: list[str], files: list[str], hyp_lists: list[list[str]]
) -> list[SystemResult]:
    """Each system's `SystemResult` from sacreBLEU's BLEU results (the baseline's first); a
    system the paired test cannot measure against the baseline gets p = 1 and a note."""
    base = scores[0]
    results = []
    for i, (res, name, path) in enumerate(zip(scores, names, files)):
        note = "" if i == 0 else _untestable(hyp_lists[i], hyp_lists[0], res.score, base.score)
        p = None if i == 0 else (1.0 if note else float(res.p_value))
        results.append(
            SystemResult(
                name=name,
                path=str(path),
                bleu=float(res.score),
                mean=float(res.mean),
                ci=float(res.ci),
                p_value=p,
                identical=note == "identical",
                note=note,
            )
        )
    return results


def _untestable(hyps: list[str], baseline: list[str], bleu: float, base_bleu: float) -> str:
    """Why the paired test has nothing to measure against the baseline, or "" when it has.

    sacreBLEU's p counts the resamples whose centred difference is strictly above the observed
    one, plus one; when every resample gives the same difference it counts none and returns its
    smallest value, which would call two equal systems significantly different.
    """
    if hyps == baseline:
        return "identical"
    # equal statistics give equal BLEU; the tolerance absorbs rounding of equal ratios (1/2, 2/4)
    if math.isclose(bleu, base_bleu, rel_tol=0.0, abs_tol=1e-9):
        return "same BLEU"
    if len(hyps) == 1:  # every resample is the one sentence: the difference never varies
        return "one sentence"
    return ""


def format_table(results: Sequence[SystemResult], signature: str) -> str:
    """A markdown table of the results (the baseline first), with the test's signature."""
    lines = [
        f"paired bootstrap resampling, baseline: {results[0].name}",
        "",
        "| system | BLEU | mean +- 95% CI | p vs baseline | |",
        "|---|---|---|---|---|",
    ]
    for i, r in enumerate(results):
        if i == 0:
            p, mark = "(baseline)", ""
        else:
            p = f"{r.p_value:.4f}"
            mark = r.note or ("*" if r.significant else "")
        lines.append(f"| {r.name} | {r.bleu:.2f} | {r.mean:.2f} +- {r.ci:.2f} | {p} | {mark} |")
    lines += ["", f"* p < {ALPHA}: the BLEU difference is significant. {signature}"]
    notes = sorted({r.note for r in results if r.note})
    if notes:
        lines.append(f"{', '.join(notes)}: p = 1, the paired test has nothing to measure.")
    return "\n".join(lines)
