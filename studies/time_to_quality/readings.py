"""The readings of every time-to-quality arm so far: setting -> valid BLEU -> minutes.

    python -m studies.time_to_quality.readings [--runs outputs/ttq]

One row per finished arm (its summary.json): seconds per epoch, the best valid BLEU and the
command's minutes when it was reached, and the minutes at which valid BLEU first reached each of
`THRESHOLDS` (- never), and the best valid BLEU by each of `BY_MINUTES`, from the run's own
validation records.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from studies.time_to_quality.arms import BASE

THRESHOLDS = (30.0, 35.0, 37.9, 40.0, 41.0)
BY_MINUTES = (12.0, 20.0)  # the best valid BLEU by these minutes: arms of other caps compared
RUNS = Path(__file__).resolve().parents[2] / "outputs" / "ttq"


def first_minutes(validations: list[dict[str, Any]], threshold: float) -> float | None:
    """The minutes of the first validation whose valid BLEU reached `threshold`."""
    for v in validations:
        bleu, minutes = v.get("valid/bleu"), v.get("minutes")
        if isinstance(bleu, (int, float)) and isinstance(minutes, (int, float)):
            if bleu >= threshold:
                return float(minutes)
    return None


def best_by(validations: list[dict[str, Any]], minutes: float) -> float | None:
    """The best valid BLEU of the validations done by `minutes` (None: none by then)."""
    scores = [
        v["valid/bleu"]
        for v in validations
        if isinstance(v.get("valid/bleu"), (int, float))
        and isinstance(v.get("minutes"), (int, float))
        and v["minutes"] <= minutes
    ]
    return max(scores, default=None)


def command_line(folder: Path) -> list[str]:
    """The run's command-line overrides as given (.hydra/overrides.yaml; none without it)."""
    path = folder / ".hydra" / "overrides.yaml"
    return (yaml.safe_load(path.read_text()) or []) if path.exists() else []


def overrides(folder: Path) -> str:
    """The run's command-line overrides less the arms' common ones."""
    given = command_line(folder)
    own = [o for o in given if o not in BASE and not o.startswith(("hydra.", "resume="))]
    return " ".join(f"`{o}`" for o in own) or "(none)"


def row(folder: Path, summary: dict[str, Any]) -> list[str]:
    """The table's cells for one arm."""
    validations = [v for v in summary.get("validations") or [] if "valid/bleu" in v]
    best = max(validations, key=lambda v: v["valid/bleu"], default=None)
    cells = [
        folder.name,
        overrides(folder),
        str(summary.get("epochs")),
        f"{summary.get('seconds_per_epoch', float('nan')):.1f}",
        f"{best['valid/bleu']:.2f} at {best['minutes']:.1f}" if best else "-",
    ]
    for t in THRESHOLDS:
        m = first_minutes(validations, t)
        cells.append("-" if m is None else f"{m:.1f}")
    for by in BY_MINUTES:
        b = best_by(validations, by)
        cells.append("-" if b is None else f"{b:.2f}")
    return cells


def table(runs: Path) -> str:
    """The markdown table of every arm with a summary.json under `runs`."""
    head = ["arm", "overrides", "epochs", "s/epoch", "best valid BLEU at min"]
    head += [f"min to {t:g}" for t in THRESHOLDS]
    head += [f"best by {m:g} min" for m in BY_MINUTES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for folder in sorted(p for p in runs.iterdir() if (p / "summary.json").exists()):
        summary = json.loads((folder / "summary.json").read_text())
        lines.append("| " + " | ".join(row(folder, summary)) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=Path, default=RUNS)
    print(table(ap.parse_args().runs))


if __name__ == "__main__":
    main()
