"""Test BLEU against minutes: the checkpoint a user would take at each moment of a run, scored.

A run of the study keeps every epoch's checkpoint (`checkpoint.keep_epochs=-1`). At each
validation the checkpoint a user would take is the best by valid BLEU so far; whenever it
changes, that epoch's checkpoint translates test2016 (beam 5, `python run.py task=generate`).
The curve is a step function: from the minute of that validation on, test BLEU is its score.

    python -m studies.time_to_quality.curve outputs/ttq/fast_seed1 [...]   # writes test_curve.json
    python -m studies.time_to_quality.curve --table outputs/ttq/fast_seed{1,2,3} --plot docs/img/ttq.png
    python -m studies.time_to_quality.curve RUN... --group multi30k_fconv RUN... --plot ttq.png
    python -m studies.time_to_quality.curve --table RUN... --targets 34,35.65,37.15 --goals 45:37.15

`--table` prints, over the runs (seeds), the mean and spread of the minutes until test BLEU
first reached each target (`--targets`, default `TARGETS`) and of test BLEU at `AT_MINUTES`.
The figure stars the goals (`--goals MINUTES:BLEU,...`, default `GOALS`) and names the runs'
translation direction; the runs' legend entry is their `experiment=` unless `--label` names it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import yaml

from convseq.common.machine import cpu_model
from studies.time_to_quality.readings import command_line
from studies.time_to_quality.scoring import bleu, epoch_checkpoint, kept_epochs

TARGETS = (37.9, 39.0, 40.0, 41.0, 42.0)
AT_MINUTES = (8.0, 10.0, 20.0, 45.0)
GOALS = ((8.0, 37.9), (20.0, 41.0), (45.0, 42.0))  # issue 34's, German -> English
CURVE_FILE = "test_curve.json"


def best_so_far(validations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The validations at which the best valid BLEU so far changed (epoch, minutes, bleu)."""
    out: list[dict[str, Any]] = []
    for v in validations:
        bleu = v.get("valid/bleu")
        if isinstance(bleu, (int, float)) and (not out or bleu > out[-1]["valid_bleu"]):
            out.append({"epoch": int(v["epoch"]), "minutes": v["minutes"], "valid_bleu": bleu})
    return out


def score_test(run: Path, epoch: int, beam: int = 5) -> float:
    """test2016 sacreBLEU of `run`'s checkpoint of `epoch` (translated once, then read back)."""
    ckpt = epoch_checkpoint(run, epoch)
    return bleu(ckpt, run / "test_curve" / ckpt.stem, "test", beam=beam)


def curve(run: Path) -> list[dict[str, Any]]:
    """The run's steps: minutes, epoch, valid BLEU of the best so far, its test BLEU."""
    summary = json.loads((run / "summary.json").read_text())
    steps = best_so_far(summary["validations"])
    for step in steps:
        step["test_bleu"] = score_test(run, step["epoch"])
    (run / CURVE_FILE).write_text(json.dumps(steps, indent=1) + "\n")
    return steps


def minutes_to(steps: list[dict[str, Any]], target: float) -> float | None:
    return next((s["minutes"] for s in steps if s["test_bleu"] >= target), None)


def bleu_at(steps: list[dict[str, Any]], minutes: float) -> float | None:
    """Test BLEU of the checkpoint a user holds at `minutes` (None before the first; a run that
    ended sooner holds its last best)."""
    held = [s for s in steps if s["minutes"] <= minutes]
    return held[-1]["test_bleu"] if held else None


def _spread(values: list[float | None]) -> str:
    """`mean (min-max)` of the runs that got there, and how many did when not all."""
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    text = (
        f"{statistics.mean(got):.2f}"
        if len(got) == 1
        else (f"{statistics.mean(got):.2f} ({min(got):.2f}-{max(got):.2f})")
    )
    return text if len(got) == len(values) else f"{text}, {len(got)} of {len(values)}"


def table(runs: list[Path], targets: tuple[float, ...] = TARGETS) -> str:
    """Markdown: minutes to each test BLEU target and test BLEU at fixed minutes, over `runs`."""
    curves = [json.loads((r / CURVE_FILE).read_text()) for r in runs]
    head = [f"min to test {t:g}" for t in targets] + [f"test BLEU at {m:g} min" for m in AT_MINUTES]
    cells = [_spread([minutes_to(c, t) for c in curves]) for t in targets]
    cells += [_spread([bleu_at(c, m) for c in curves]) for m in AT_MINUTES]
    ended = max(c[-1]["minutes"] for c in curves)
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        "| " + " | ".join(cells) + " |",
    ]
    return "\n".join(lines) + f"\n\n{len(runs)} runs; the last best checkpoint at {ended:.1f} min."


def run_end(run: Path) -> float | None:
    """The command's minutes at the run's last validation: summary.json's, or (runs whose
    summary stopped at the best epoch) the last per-epoch checkpoint's record; None if unknown."""
    summary = run / "summary.json"
    validations = json.loads(summary.read_text())["validations"] if summary.exists() else []
    last = max((v for v in validations if "minutes" in v), key=lambda v: v["epoch"], default=None)
    kept = kept_epochs(run)
    if kept and (last is None or max(kept) > int(last["epoch"])):
        import torch

        newest = kept[max(kept)]
        record = torch.load(newest, map_location="cpu", weights_only=True).get("convseq", {})
        last = (record.get("validations") or [last])[-1]
    return float(last["minutes"]) if last else None


def run_setting(run: Path, key: str) -> str | None:
    """`key` (e.g. "experiment") as the run's command line set it (.hydra/overrides.yaml)."""
    given = command_line(run)
    found = [o.split("=", 1)[1] for o in given if o.split("=", 1)[0].lstrip("+") == key]
    return found[-1] if found else None


def direction(run: Path) -> str:
    """The run's translation direction, e.g. "de-en" (.hydra/config.yaml's data languages)."""
    path = run / ".hydra" / "config.yaml"
    data = (yaml.safe_load(path.read_text()) or {}).get("data", {}) if path.exists() else {}
    src, tgt = data.get("src_lang"), data.get("tgt_lang")
    return f"{src}-{tgt}" if src and tgt else "de-en"


def plot(
    groups: dict[str, list[Path]],
    path: Path,
    cpu: str = "",
    goals: tuple[tuple[float, float], ...] = GOALS,
) -> Path:
    """Test BLEU of the checkpoint a user holds against the command's minutes: one step line
    per run, a colour per recipe (`groups`: recipe label -> its runs' folders), the `goals`
    (minutes, BLEU) starred, each run's end marked; `cpu` names the machine on the x axis."""
    from convseq.viz.canvas import finish_figure, new_figure, save_png

    fig = new_figure(8, 4.5)
    ax = fig.add_subplot(1, 1, 1)
    for colour, (label, runs) in zip(("tab:blue", "tab:orange", "tab:green"), groups.items()):
        for i, run in enumerate(runs):
            steps = json.loads((run / CURVE_FILE).read_text())
            xs = [s["minutes"] for s in steps]
            ys = [s["test_bleu"] for s in steps]
            end = run_end(run)
            if end is not None and end > xs[-1]:  # held until the run stopped
                xs, ys = [*xs, end], [*ys, ys[-1]]
            ax.step(xs, ys, where="post", color=colour, alpha=0.8, label=label if i == 0 else None)
            if end is not None:
                ax.plot([xs[-1]], [ys[-1]], marker="|", markersize=10, color=colour)
    for minutes, goal in goals:
        ax.plot([minutes], [goal], marker="*", color="black", linestyle="none")
    where = f"2 cores of {cpu}" if cpu else "2 CPU cores"
    ax.set_xlabel(f"minutes since the command started ({where})")
    ax.set_ylabel("test2016 BLEU (beam 5, best-by-valid checkpoint)")
    ax.set_ylim(bottom=20)
    ax.grid(alpha=0.3)
    pair = direction(next(iter(groups.values()))[0])  # the first run's, e.g. "de-en"
    return save_png(
        finish_figure(
            fig, ax, f"Multi30k {pair}: time to quality (stars: the goals; |: a run's end)"
        ),
        path,
    )


def _numbers(text: str) -> tuple[float, ...]:
    """`--targets`: "37.9,39" -> (37.9, 39.0)."""
    try:
        return tuple(float(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give BLEU values split by commas, e.g. 37.9,39"
        ) from None


def _goals(text: str) -> tuple[tuple[float, float], ...]:
    """`--goals`: "8:37.9,45:42" -> ((8.0, 37.9), (45.0, 42.0))."""
    try:
        return tuple((float(m), float(b)) for m, b in (g.split(":") for g in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give MINUTES:BLEU pairs, e.g. 8:37.9,45:42"
        ) from None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--table", action="store_true", help="only the table of existing curves")
    ap.add_argument("--plot", type=Path, help="also draw the curves into this PNG")
    ap.add_argument("--label", help="the runs' legend entry (default: their experiment=)")
    ap.add_argument(
        "--group",
        nargs="+",
        action="append",
        default=[],
        metavar="LABEL RUN",
        help="another recipe's runs in the figure and a table of their own: a label, then folders",
    )
    ap.add_argument("--targets", type=_numbers, default=TARGETS, help="test BLEU targets: 37.9,39")
    ap.add_argument("--goals", type=_goals, default=GOALS, help="starred goals: 8:37.9,45:42")
    ap.add_argument("--cpu", help="the training machine's CPU for the figure (default: this one's)")
    return ap


def main() -> None:
    ap = _parser()
    args = ap.parse_args()
    label = args.label or run_setting(args.runs[0], "experiment") or args.runs[0].name
    groups = {label: args.runs}
    for label, *runs in args.group:
        if not runs:
            ap.error(f"--group {label}: give the label, then at least one run folder")
        groups[label] = [Path(r) for r in runs]
    for label, runs in groups.items():
        if not args.table:
            for run in runs:
                for s in curve(run):
                    print(
                        f"{run.name}: epoch {s['epoch']} at {s['minutes']:.1f} min: valid "
                        f"{s['valid_bleu']:.2f}, test {s['test_bleu']:.2f}",
                        flush=True,
                    )
        print(f"{label}:\n{table(runs, args.targets)}\n")
    if args.plot:
        print(f"figure: {plot(groups, args.plot, args.cpu or cpu_model(), args.goals)}")


if __name__ == "__main__":
    main()
