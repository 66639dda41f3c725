"""The study's paired bootstrap: every arm's test BLEU against the PyTorch-style end point.

The baseline is the tp arm (token batches, plateau annealing, the NAG setting, seed 1); each
other finished arm's `generate-test.txt` (best.ckpt's test translations) is tested against it
with `convseq.evaluation.bootstrap.paired_bootstrap`, in one call, so every p-value comes from the
same resampled sentence sets. Arms that cannot be tested (unfinished, no translations, another
line count than the references) get a reason instead of a p-value; nothing here raises for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from convseq.errors import ConvseqError
from convseq.evaluation.bootstrap import ALPHA, paired_bootstrap, read_lines

from .runs import StudyRun

__all__ = ["ReferenceLoader", "StudyBootstrap", "references_from_file", "study_bootstrap"]

# given the baseline's run folder: (reference lines, where they came from)
ReferenceLoader = Callable[[Path], tuple[Sequence[str], str]]


@dataclass
class StudyBootstrap:
    """p-values of test BLEU against the baseline, or why there are none."""

    baseline: str | None  # its run folder
    references: str = ""  # where the reference lines came from
    signature: str = ""
    n_samples: int = 0
    alpha: float = ALPHA
    p_values: dict[str, float] = field(default_factory=dict)  # run folder -> p
    bleu: dict[str, float] = field(default_factory=dict)  # run folder -> sacreBLEU of its file
    skipped: dict[str, str] = field(default_factory=dict)  # run folder -> why no p-value
    note: str = ""  # why there is no bootstrap at all (empty when it ran)


def study_bootstrap(
    runs: Sequence[StudyRun],
    baseline: StudyRun | None,
    references: ReferenceLoader | None,
    n_samples: int = 1000,
    seed: int = 12345,
    tokenize: str = "13a",
) -> StudyBootstrap:
    """Test every other run's translations against `baseline`'s (see the module docstring)."""
    out = StudyBootstrap(baseline=baseline.name if baseline is not None else None)
    if baseline is None:
        out.note = "no baseline: the tokens + plateau NAG arm of seed 1 is missing"
        return out
    if baseline.hypotheses is None:
        out.note = (
            f"no baseline translations: {baseline.name} is {baseline.status} and has no "
            "generate-test.txt (written after the final test of a finished run)"
        )
        return out
    if references is None:
        out.note = "no references given (--refs FILE, or the baseline's data-bin)"
        return out
    try:
        refs, out.references = references(baseline.path)
        refs = list(refs)
        systems = [(baseline.name, read_lines(baseline.hypotheses))]
    except ConvseqError as e:
        out.note = f"no bootstrap: {e}"
        return out
    if len(systems[0][1]) != len(refs):
        out.note = (
            f"no bootstrap: {baseline.hypotheses} has {len(systems[0][1])} lines, the references "
            f"({out.references}) {len(refs)}; pass the right file with --refs FILE"
        )
        return out
    paths = [str(baseline.hypotheses)]
    for r in runs:
        if r is baseline:
            continue
        if r.hypotheses is None:
            out.skipped[r.name] = "unfinished" if not r.finished else "no generate-test.txt"
            continue
        try:
            hyps = read_lines(r.hypotheses)
        except ConvseqError as e:
            out.skipped[r.name] = str(e)
            continue
        if len(hyps) != len(refs):
            out.skipped[r.name] = f"{len(hyps)} lines for {len(refs)} references"
            continue
        systems.append((r.name, hyps))
        paths.append(str(r.hypotheses))
    if len(systems) < 2:
        out.note = "no other arm has test translations yet"
        return out
    results, out.signature = paired_bootstrap(
        systems, refs, n_samples=n_samples, seed=seed, tokenize=tokenize, paths=paths
    )
    out.n_samples = n_samples
    out.bleu = {r.name: r.bleu for r in results}
    out.p_values = {r.name: float(r.p_value) for r in results[1:] if r.p_value is not None}
    return out


def references_from_file(path: str) -> ReferenceLoader:
    """A `ReferenceLoader` that reads one reference file (the report's ``--refs``)."""

    def load(_: Path) -> tuple[list[str], str]:
        return read_lines(path), str(path)

    return load
