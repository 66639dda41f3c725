"""The study report: one table row per arm, the decomposition of the extra epochs, plots.

`write_study_report(study_dir)` reads a study folder (`runs`: one training run folder per arm,
`timing.json` optional) and writes into it:

- `study_report.md`: the table (per arm: seconds per epoch and where they came from, total
  epochs, total training time, the epoch where annealing started, best valid BLEU and its epoch,
  test BLEU of best.ckpt, the paired bootstrap p-value against the PyTorch-style end point, stop
  reason), the 2x2 decomposition of the extra epochs, momentum, the seed spread and whether
  "plateau adds 10-15 epochs" holds (`effects`);
- `study_report.json`: the same figures and the plotted numbers;
- `study_bleu_minutes.png`, `study_lr.png`, `study_epochs_time.png` (`figures`).

An unfinished arm is listed from its `csv/metrics.csv` with its status; parts that need arms the
folder does not (yet) hold say so. From the project folder:

    python -m studies.batching_annealing.report                     # outputs/study
    python -m studies.batching_annealing.report --study DIR --refs FILE

The test references of the bootstrap are ``--refs``, else the test references in the data-bin of
the baseline run's own ``data`` settings (its ``.hydra/config.yaml``), looked up under the data
root and cache folder that ``python run.py`` would use (``CONVSEQ_DATA_ROOT``,
``CONVSEQ_CACHE``: see `references`); its settings default to task=compare's (1000 resamples,
seed 12345, sacreBLEU's 13a tokenizer).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from convseq.viz.runs import RunCurves

from .bootstrap import ReferenceLoader, StudyBootstrap, study_bootstrap
from .effects import factorial, find_arm, momentum_rows, nag_setting, seed_spread, verdict
from .figures import plot_study
from .markdown import to_markdown
from .runs import TIMING_FILE, StudyRun, load_study

__all__ = ["STUDY_FILES", "main", "study_record", "write_study_report"]

STUDY_FILES = {
    "markdown": "study_report.md",
    "json": "study_report.json",
    "bleu": "study_bleu_minutes.png",
    "lr": "study_lr.png",
    "bars": "study_epochs_time.png",
}


def _row(run: StudyRun, boot: StudyBootstrap) -> dict[str, Any]:
    a = run.arm
    if run.name == boot.baseline:
        p_value, p_note = None, "baseline"
    else:
        p_value = boot.p_values.get(run.name)
        p_note = "" if p_value is not None else boot.skipped.get(run.name, "")
        if p_value is None and not p_note:
            p_note = "unfinished" if not run.finished else "no bootstrap"
    return {
        "run": run.name,
        "batching": a.batching,
        "annealing": a.annealing,
        "optimiser": a.optimiser,
        "optimizer": a.optimizer,
        "momentum": a.momentum,
        "lr": a.lr,
        "force_anneal": a.force_anneal,
        "seed": a.seed,
        "status": run.status,
        "finished": run.finished,
        "stopped_by_rule": run.stopped_by_rule,
        "seconds_per_epoch": run.seconds_per_epoch,
        "time_source": run.time_source,
        "epochs": run.epochs,
        "total_seconds": run.total_seconds,
        "anneal_start": run.anneal_start,
        "best_valid_bleu": run.best_bleu,
        "best_bleu_epoch": run.best_bleu_epoch,
        "test_bleu": run.test_bleu,
        "p_value": p_value,
        "p_note": p_note,
        "stop_reason": run.stop_reason,
    }


def _style(run: StudyRun) -> dict[str, Any]:
    """Solid: NAG seed 1; dashed: plain SGD; dotted: other seeds."""
    if run.arm.optimizer == "sgd":
        return {"linestyle": "--"}
    return {"linestyle": ":" if run.arm.seed not in (None, 1) else "-"}


def study_record(
    study_dir: str | os.PathLike,
    references: ReferenceLoader | None = None,
    n_samples: int = 1000,
    seed: int = 12345,
    tokenize: str = "13a",
) -> tuple[list[StudyRun], dict[str, Any]]:
    """(the runs, every figure of the report as plain JSON data: None where unknown); see
    `write_study_report`."""
    root = Path(study_dir).absolute()
    runs, notes = load_study(root)
    setting = nag_setting(runs)
    baseline = find_arm(runs, "tokens", "plateau", setting, 1)
    boot = study_bootstrap(runs, baseline, references, n_samples, seed, tokenize)
    spread = seed_spread(runs, setting)
    epochs = factorial(runs, lambda r: float(r.epochs), setting)
    hours = factorial(runs, lambda r: r.total_seconds / 3600.0, setting)
    record = {
        "study_dir": str(root),
        "timing": TIMING_FILE if (root / TIMING_FILE).is_file() else None,
        "nag_setting": list(setting) if setting is not None else None,
        "baseline": baseline.name if baseline is not None else None,
        "rows": [_row(r, boot) for r in runs],
        "factorial": {"epochs": asdict(epochs), "hours": asdict(hours)},
        "momentum": momentum_rows(runs, setting),
        "seeds": spread,
        "verdict": verdict(epochs, spread["pooled_epochs_sd"]),
        "bootstrap": asdict(boot),
        "notes": notes,
        "curves": [
            {
                "run": r.name,
                "epoch": r.epoch,
                "minutes": r.minutes,
                "lr": r.lr,
                "valid_bleu": r.valid_bleu,
            }
            for r in runs
        ],
    }
    return runs, _json_value(record)


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_study_report(
    study_dir: str | os.PathLike,
    references: ReferenceLoader | None = None,
    output_dir: str | os.PathLike | None = None,
    plot: bool = True,
    n_samples: int = 1000,
    seed: int = 12345,
    tokenize: str = "13a",
) -> dict[str, Path]:
    """Write the study report (see the module docstring) and return its files by kind.

    Args:
        study_dir: the study folder, one run folder per arm (`timing.json` optional).
        references: loads the test references given the baseline's run folder (see
            `bootstrap`; `references.databin_references`); None: no bootstrap.
        output_dir: where to write (default: `study_dir`).
        plot: write the three PNGs.
        n_samples, seed, tokenize: the paired bootstrap's resamples, seed and sacreBLEU
            tokenizer.

    Raises:
        DataError: no such folder, no run in it, an unreadable run file, or a malformed
            timing.json (each named).
    """
    runs, record = study_record(study_dir, references, n_samples, seed, tokenize)
    out = Path(output_dir).absolute() if output_dir is not None else Path(record["study_dir"])
    out.mkdir(parents=True, exist_ok=True)
    files = {kind: out / name for kind, name in STUDY_FILES.items()}
    if plot:
        curves = [
            RunCurves(r.name, r.path, r.time_source, r.epoch, r.minutes, r.valid_bleu, [], r.lr)
            for r in runs
        ]
        bars = {
            "labels": [r.name for r in runs],
            "epochs": [float(r.epochs) for r in runs],
            "minutes": [r.total_seconds / 60.0 for r in runs],
            "done": [r.complete for r in runs],
        }
        title = Path(record["study_dir"]).name
        plot_study(curves, files, [_style(r) for r in runs], bars, title)
        record["plots"] = {k: STUDY_FILES[k] for k in ("bleu", "lr", "bars")}
    else:
        for kind in ("bleu", "lr", "bars"):
            files.pop(kind)
    _write(files["markdown"], to_markdown(record))
    _write(files["json"], json.dumps(record, indent=2) + "\n")
    return files


def main(argv: list[str] | None = None) -> dict[str, Path]:
    """The command line (see the module docstring): write the report, print it and its files."""
    import argparse
    import sys

    from convseq.errors import ConvseqError, DataError

    from .bootstrap import references_from_file
    from .references import databin_references, run_paths

    root = Path(__file__).resolve().parents[2]  # the project folder
    parser = argparse.ArgumentParser(
        prog="python -m studies.batching_annealing.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--study", type=Path, default=root / "outputs" / "study", help="the study folder"
    )
    parser.add_argument(
        "--refs",
        help="the test reference file of the paired bootstrap (default: the test references in "
        "the data-bin of the baseline run's own data settings)",
    )
    parser.add_argument("--n-samples", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=12345, help="the bootstrap's seed (>= 1)")
    parser.add_argument("--tokenize", default="13a", help="sacreBLEU's tokenizer")
    parser.add_argument("--output", type=Path, help="where to write (default: the study folder)")
    parser.add_argument("--no-plots", action="store_true", help="write no PNG")
    args = parser.parse_args(argv)
    references = references_from_file(args.refs) if args.refs else databin_references(run_paths())
    try:
        if not args.study.is_dir():  # the sweep report's own message names sweep_dir=
            raise DataError("no such study folder; pass --study DIR (the driver's --root)",
                            path=str(args.study))  # fmt: skip
        files = write_study_report(
            args.study,
            references=references,
            output_dir=args.output,
            plot=not args.no_plots,
            n_samples=args.n_samples,
            seed=args.seed,
            tokenize=args.tokenize,
        )
    except ConvseqError as e:  # bad input: one clear line, as `python run.py` prints it
        print(f"convseq: error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
    print(files["markdown"].read_text(), end="")
    print(f"convseq: study report written: {', '.join(str(p) for p in files.values())}")
    return files


if __name__ == "__main__":
    main()
