"""Where the extra epochs come from: the study's 2x2 factorial, momentum and the seed spread.

The PyTorch-style end point (`tp`: token batches, plateau annealing) against the Lua-style one
(`sl`: sentence batches, Lua annealing), both NAG and seed 1, with the two mixed arms `tl`
(tokens + lua) and `sp` (sentences + plateau):

- annealing-rule effect = ((tp - tl) + (sp - sl)) / 2, batching effect = ((tp - sp) + (tl - sl)) / 2;
  they sum exactly to tp - sl. The one-path versions (tp - tl, sp - sl; tp - sp, tl - sl) are
  given beside them;
- momentum: each NAG arm against its plain-SGD (momentum 0) counterparts of the same rules and
  seed, at every lr they were run with;
- seed spread: epochs and test BLEU of each end point over its seeds, and of their difference
  paired by seed.

Only runs that stopped by their own annealing rule count (their epoch count is the answer); a
part whose arms are missing or unfinished says which and why instead of a number.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .runs import StudyRun

__all__ = [
    "CELLS",
    "CLAIM",
    "Factorial",
    "factorial",
    "find_arm",
    "momentum_rows",
    "nag_setting",
    "seed_spread",
    "verdict",
]

# the four cells of the factorial: (batching, annealing)
CELLS = {
    "tp": ("tokens", "plateau"),
    "tl": ("tokens", "lua"),
    "sp": ("sentences", "plateau"),
    "sl": ("sentences", "lua"),
}
CLAIM = (10.0, 15.0)  # "in PyTorch we wait ... that adds 10-15 epochs on small datasets"


def nag_setting(runs: Sequence[StudyRun]) -> tuple[str, float, float] | None:
    """The (optimizer, momentum, lr) of the study's NAG arms: the tp seed-1 arm's, else the most
    common NAG setting with momentum; None without NAG arms."""
    nag = [r for r in runs if r.arm.optimizer == "nag" and r.arm.momentum > 0]
    for r in nag:
        if (r.arm.batching, r.arm.anneal, r.arm.seed) == ("tokens", "plateau", 1):
            return r.arm.setting
    if not nag:
        return None
    return Counter(r.arm.setting for r in nag).most_common(1)[0][0]


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def find_arm(
    runs: Sequence[StudyRun],
    batching: str,
    anneal: str,
    setting: tuple[str, float, float] | None,
    seed: int | None = 1,
) -> StudyRun | None:
    """The first run (in folder order) of these rules, optimiser setting and seed, if any."""
    for r in runs:
        if (r.arm.batching, r.arm.anneal, r.arm.seed) == (batching, anneal, seed) and _has(
            r, setting
        ):
            return r
    return None


def _has(run: StudyRun, setting: tuple[str, float, float] | None) -> bool:
    """Whether the run trained with this (optimizer, momentum, lr)."""
    a = run.arm
    if setting is None:
        return False
    return a.optimizer == setting[0] and _same(a.momentum, setting[1]) and _same(a.lr, setting[2])


def _epochs(n: int) -> str:
    return f"{n} epoch" if n == 1 else f"{n} epochs"


def why_not(run: StudyRun | None) -> str | None:
    """Why a run's epoch count cannot be used (None: it can)."""
    if run is None:
        return "no such run"
    if not run.finished:
        return f"{run.name}: {run.status}, {_epochs(run.epochs)} so far"
    if not run.stopped_by_rule:
        return f"{run.name}: did not stop by its annealing rule ({run.stop_reason or 'no reason'})"
    return None


@dataclass
class Factorial:
    """The 2x2 decomposition of one figure (epochs, hours) of tp - sl. None: not computable."""

    values: dict[str, float | None]  # tp, tl, sp, sl
    missing: dict[str, str]  # cell -> why it has no value
    runs: dict[str, str | None]  # cell -> its run folder
    total: float | None = None  # tp - sl
    anneal: float | None = None  # ((tp - tl) + (sp - sl)) / 2
    batching: float | None = None  # ((tp - sp) + (tl - sl)) / 2
    anneal_paths: dict[str, float | None] = field(default_factory=dict)  # tokens, sentences
    batching_paths: dict[str, float | None] = field(default_factory=dict)  # plateau, lua


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _mean2(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else (a + b) / 2


def factorial(
    runs: Sequence[StudyRun],
    figure: Callable[[StudyRun], float],
    setting: tuple[str, float, float] | None,
    seed: int = 1,
) -> Factorial:
    """The decomposition of `figure` (e.g. epochs) over the four cells at one seed."""
    values: dict[str, float | None] = {}
    missing, names = {}, {}
    for cell, (batching, anneal) in CELLS.items():
        run = find_arm(runs, batching, anneal, setting, seed)
        names[cell] = run.name if run is not None else None
        reason = why_not(run)
        value = figure(run) if run is not None and reason is None else math.nan
        if reason is None and not math.isfinite(value):
            reason = f"{run.name}: no value" if run is not None else "no such run"
        values[cell] = None if reason else float(value)
        if reason:
            missing[cell] = reason
    tp, tl, sp, sl = (values[c] for c in CELLS)
    return Factorial(
        values=values,
        missing=missing,
        runs=names,
        total=_diff(tp, sl),
        anneal=_mean2(_diff(tp, tl), _diff(sp, sl)),
        batching=_mean2(_diff(tp, sp), _diff(tl, sl)),
        anneal_paths={"tokens": _diff(tp, tl), "sentences": _diff(sp, sl)},
        batching_paths={"plateau": _diff(tp, sp), "lua": _diff(tl, sl)},
    )


# -- momentum ------------------------------------------------------------------------------------
def momentum_rows(
    runs: Sequence[StudyRun], setting: tuple[str, float, float] | None, seed: int = 1
) -> list[dict[str, Any]]:
    """Each NAG arm (of `setting`, at `seed`) that has plain-SGD (momentum 0) counterparts,
    then those counterparts by lr: one row each, with their epochs and the difference."""
    if setting is None:
        return []
    # plain SGD: momentum 0 (optim=sgd, or NAG with its momentum off: the same update)
    sgd = [
        r
        for r in runs
        if r.arm.optimizer in ("sgd", "nag") and r.arm.momentum == 0 and r.arm.seed == seed
    ]
    groups = sorted({(r.arm.batching, r.arm.anneal) for r in sgd})
    matched_lr = setting[2] / (1 - setting[1]) if setting[1] < 1 else math.nan
    rows = []
    for batching, anneal in groups:
        nag = find_arm(runs, batching, anneal, setting, seed)
        nag_epochs = float(nag.epochs) if nag is not None and why_not(nag) is None else None
        rows.append(_momentum_row(batching, anneal, nag, "NAG", nag_epochs, None))
        for r in sorted(
            (r for r in sgd if (r.arm.batching, r.arm.anneal) == (batching, anneal)),
            key=lambda r: r.arm.lr,
        ):
            note = ""
            if _same(r.arm.lr, setting[2]):
                note = "the NAG lr"
            elif math.isfinite(matched_lr) and _same(r.arm.lr, matched_lr):
                note = f"NAG's effective step: {setting[2]:g} / (1 - {setting[1]:g})"
            rows.append(_momentum_row(batching, anneal, r, "SGD", nag_epochs, note))
    return rows


def _momentum_row(
    batching: str,
    anneal: str,
    run: StudyRun | None,
    kind: str,
    nag_epochs: float | None,
    lr_note: str | None,
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "batching": batching,
        "anneal": anneal,
        "kind": kind,
        "run": run.name if run is not None else None,
        "optimiser": run.arm.optimiser if run is not None else None,
        "lr_note": lr_note or "",
        "epochs": None,
        "epochs_text": "",
        "test_bleu": run.test_bleu if run is not None else math.nan,
        "nag_minus_sgd": None,
        "nag_minus_sgd_text": "",
    }
    reason = why_not(run)
    if run is None:
        row["epochs_text"] = "no such run"
    elif reason is None:
        row["epochs"] = run.epochs
        row["epochs_text"] = str(run.epochs)
    elif run.finished and run.anneal_start is None:
        row["epochs_text"] = f"did not anneal within {run.epochs} epochs"
    elif run.finished:
        row["epochs_text"] = (
            f"did not finish annealing within {run.epochs} epochs "
            f"(started at epoch {run.anneal_start})"
        )
    else:
        row["epochs_text"] = f"{run.status}, {_epochs(run.epochs)} so far"
    if kind == "SGD" and nag_epochs is not None and run is not None:
        if row["epochs"] is not None:
            row["nag_minus_sgd"] = nag_epochs - row["epochs"]
            row["nag_minus_sgd_text"] = f"{nag_epochs - row['epochs']:+g}"
        elif run.finished:  # censored: SGD needs more than run.epochs epochs
            row["nag_minus_sgd_text"] = f"< {nag_epochs - run.epochs:+g}"
    return row


# -- seeds ---------------------------------------------------------------------------------------
def describe(values: Sequence[float]) -> dict[str, Any]:
    """n, mean, sample sd (NaN for one value), min and max of a list (NaN when empty)."""
    vs = [float(v) for v in values if math.isfinite(float(v))]
    if not vs:
        return {"n": 0, "mean": math.nan, "sd": math.nan, "min": math.nan, "max": math.nan}
    return {
        "n": len(vs),
        "mean": statistics.fmean(vs),
        "sd": statistics.stdev(vs) if len(vs) > 1 else math.nan,
        "min": min(vs),
        "max": max(vs),
    }


def seed_spread(
    runs: Sequence[StudyRun], setting: tuple[str, float, float] | None
) -> dict[str, Any]:
    """Epochs and test BLEU of the two end points (tp, sl) over their seeds, their difference
    paired by seed, and the pooled sd of one arm's epochs (the yardstick of an effect)."""
    out: dict[str, Any] = {"end_points": {}, "difference": {}, "pooled_epochs_sd": math.nan}
    per_seed: dict[str, dict[int, StudyRun]] = {}
    for cell in ("tp", "sl"):
        found: dict[int, StudyRun] = {}
        for r in runs:
            seed = r.arm.seed
            if seed is None or seed in found or (r.arm.batching, r.arm.anneal) != CELLS[cell]:
                continue
            if _has(r, setting) and why_not(r) is None:
                found[seed] = r
        per_seed[cell] = dict(sorted(found.items()))
        out["end_points"][cell] = {
            "seeds": list(per_seed[cell]),
            "runs": [r.name for r in per_seed[cell].values()],
            "epochs": describe([r.epochs for r in per_seed[cell].values()]),
            "test_bleu": describe([r.test_bleu for r in per_seed[cell].values()]),
        }
    both = sorted(set(per_seed["tp"]) & set(per_seed["sl"]))
    out["difference"] = {
        "seeds": both,
        "epochs": describe([per_seed["tp"][s].epochs - per_seed["sl"][s].epochs for s in both]),
        "test_bleu": describe(
            [per_seed["tp"][s].test_bleu - per_seed["sl"][s].test_bleu for s in both]
        ),
    }
    # pooled variance of one arm's epochs over seeds: sum((n_i - 1) s_i^2) / sum(n_i - 1)
    dof = sum(e["epochs"]["n"] - 1 for e in out["end_points"].values() if e["epochs"]["n"] > 1)
    if dof > 0:
        ss = sum(
            (e["epochs"]["n"] - 1) * e["epochs"]["sd"] ** 2
            for e in out["end_points"].values()
            if e["epochs"]["n"] > 1
        )
        out["pooled_epochs_sd"] = math.sqrt(ss / dof)
    return out


def verdict(fact: Factorial, pooled_sd: float) -> str:
    """One plain sentence: does "plateau adds 10-15 epochs" hold here?

    The annealing-rule effect averages two differences of two arms each, so its seed sd is about
    one arm's (`pooled_sd`); "cannot be ruled out" means 10-15 is within two of those.
    """
    lo, hi = CLAIM
    if fact.anneal is None:
        return (
            f'"Plateau adds {lo:g}-{hi:g} epochs" cannot be checked yet: the annealing-rule effect '
            "needs the four seed-1 NAG arms tp, tl, sp, sl finished by their own rule "
            f"(missing: {'; '.join(f'{k}: {v}' for k, v in fact.missing.items())})."
        )
    a = fact.anneal
    paths = ", ".join(f"{k} {v:+g}" for k, v in fact.anneal_paths.items() if v is not None)
    said = f"plateau instead of lua annealing adds {a:+g} epochs (2x2 average; {paths})"
    if math.isfinite(pooled_sd):
        spread = f"the seed sd of one arm's epochs is {pooled_sd:.1f}"
    else:
        spread = "no seed spread is known (seeds 2 and 3 of the end points are missing)"
    if lo <= a <= hi:
        return f'"Plateau adds {lo:g}-{hi:g} epochs" holds here: {said}; {spread}.'
    if math.isfinite(pooled_sd) and a + 2 * pooled_sd >= lo and a - 2 * pooled_sd <= hi:
        return (
            f'"Plateau adds {lo:g}-{hi:g} epochs" is not what this study measured but cannot be '
            f"ruled out: {said}, outside {lo:g}-{hi:g} but within twice the seed sd "
            f"({spread})."
        )
    return (
        f'"Plateau adds {lo:g}-{hi:g} epochs" does not hold here: {said}, outside '
        f"{lo:g}-{hi:g}"
        + (" by more than twice the seed sd" if math.isfinite(pooled_sd) else "")
        + f"; {spread}."
    )
