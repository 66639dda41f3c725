"""Run the time-to-quality arms one after another (each `python run.py` in its own folder).

An arm with a finished summary.json is skipped; one with checkpoints/last.ckpt continues with
`resume=true` (its minutes carry on), any other starts fresh. Run from the project folder, with
nothing else running (the minutes are the figures):

    CONVSEQ_DATA_ROOT=../shared/data python -m studies.time_to_quality.driver [ARM ...]
    python -m studies.time_to_quality.readings        # the table of every arm so far
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from studies.time_to_quality.arms import ARMS, BASE, CONTINUES

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "outputs" / "ttq"


def command(name: str, overrides: list[str]) -> list[str]:
    """The arm's `python run.py` command line (resuming where it has a last.ckpt)."""
    folder = RUNS / name
    resume = ["resume=true"] if (folder / "checkpoints" / "last.ckpt").exists() else []
    base = [] if overrides and overrides[0].startswith("experiment=") else BASE
    return [sys.executable, "run.py", *base, *overrides, f"hydra.run.dir={folder}", *resume]


def start_from(name: str) -> None:
    """A `CONTINUES` arm without a folder of its own starts as a copy of its source's folder
    (without summary.json and test_curve.json, which the continued run writes anew; the test
    translations of the shared epochs are kept)."""
    source, folder = CONTINUES.get(name), RUNS / name
    if source is None or folder.exists():
        return
    if not (RUNS / source / "checkpoints" / "last.ckpt").exists():
        raise SystemExit(f"{name} continues {source}: run {source} first")
    shutil.copytree(
        RUNS / source, folder, ignore=shutil.ignore_patterns("summary.json", "test_curve.json")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("arms", nargs="*", help="arm names (default: every arm, in order)")
    args = ap.parse_args()
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arm(s) {unknown}; arms: {', '.join(ARMS)}")
    for name in args.arms or list(ARMS):
        if (RUNS / name / "summary.json").exists():
            continue
        RUNS.mkdir(parents=True, exist_ok=True)
        start_from(name)
        with open(RUNS / f"{name}.log", "a") as log:
            subprocess.run(command(name, ARMS[name]), cwd=ROOT, stdout=log, stderr=log)


if __name__ == "__main__":
    main()
