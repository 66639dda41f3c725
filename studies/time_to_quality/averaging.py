"""Checkpoint averaging read on valid BLEU: the average of a run's last N epochs against the
single checkpoint a user would otherwise take (the best by valid BLEU so far), epoch by epoch.

    python -m studies.time_to_quality.averaging outputs/ttq/fast45_seed1 [--n 3 5] [--every 2]

The run must keep every epoch (`checkpoint.keep_epochs=-1`). At every `--every`-th epoch (and the
last), the checkpoints of that epoch and the N-1 before it are averaged
(`convseq.checkpoints.average_checkpoints`, what `task=average` does) and the average translates
the valid set (beam 5). The other columns come from the run's own validation records. Results
are kept under `<run>/averaging/`, so a second call only adds what is missing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from studies.time_to_quality.scoring import bleu, epoch_checkpoint, kept_epochs

FOLDER = "averaging"


def window(kept: set[int], epoch: int, n: int) -> list[int] | None:
    """Epochs `epoch-n+1 .. epoch` (latest first) if every one of them is in `kept`, else None."""
    epochs = list(range(epoch, epoch - n, -1))
    return epochs if epoch - n + 1 >= 1 and all(e in kept for e in epochs) else None


def best_n(bleus: dict[int, float], kept: set[int], epoch: int, n: int) -> list[int] | None:
    """The `n` kept epochs up to `epoch` with the highest valid BLEU (best first), or None."""
    ranked = sorted((e for e in bleus if e <= epoch and e in kept), key=lambda e: -bleus[e])
    return ranked[:n] if len(ranked) >= n else None


def epochs_to_read(last: int, smallest_n: int, every: int) -> list[int]:
    """Every `every`-th epoch from the first one the smallest window fits, and the last."""
    start = smallest_n + (-smallest_n) % every  # the first multiple of `every` >= smallest_n
    picked = list(range(start, last + 1, every))
    return picked if picked and picked[-1] == last else [*picked, last]


def averaged_bleu(run: Path, epochs: list[int]) -> float:
    """Valid BLEU of the average of `run`'s checkpoints of `epochs` (written once, then reused)."""
    from convseq.checkpoints.average import average_checkpoints

    out = run / FOLDER / ("e" + "-".join(f"{e:03d}" for e in sorted(epochs, reverse=True)))
    ckpt = out / "averaged.ckpt"
    if not (out / "generate-valid.json").exists() and not ckpt.exists():
        paths = [epoch_checkpoint(run, e) for e in epochs]
        out.mkdir(parents=True, exist_ok=True)
        average_checkpoints(paths, ckpt)
    score = bleu(ckpt, out, "valid")
    ckpt.unlink(missing_ok=True)  # keep the score, not 10 MB per reading
    return score


def rows(run: Path, ns: list[int], every: int) -> list[dict[str, Any]]:
    """One row per epoch read: minutes, the epoch's own and the best valid BLEU so far, and the
    valid BLEU of the average of the last n and of the best n so far (None where the run did
    not keep enough epochs)."""
    summary = json.loads((run / "summary.json").read_text())
    validations = [v for v in summary["validations"] if "valid/bleu" in v]
    by_epoch = {int(v["epoch"]): v for v in validations}
    kept = set(kept_epochs(run))
    bleus = {e: v["valid/bleu"] for e, v in by_epoch.items()}
    out = []
    for epoch in epochs_to_read(max(by_epoch), min(ns), every):
        best = max(b for e, b in bleus.items() if e <= epoch)
        row = {"epoch": epoch, "minutes": by_epoch[epoch]["minutes"], "best": best}
        row["own"] = by_epoch[epoch]["valid/bleu"]
        for n in ns:
            for name, epochs in (
                ("last", window(kept, epoch, n)),
                ("best", best_n(bleus, kept, epoch, n)),
            ):
                row[f"{name}{n}"] = averaged_bleu(run, epochs) if epochs else None
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def table(read: list[dict[str, Any]], ns: list[int]) -> str:
    """Markdown: the rows, with each average's gain over the best single checkpoint so far."""
    head = ["epoch", "minutes", "valid BLEU of the epoch", "best so far"]
    head += [f"average of the {k} {n} (vs best)" for n in ns for k in ("last", "best")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in read:
        cells = [str(r["epoch"]), f"{r['minutes']:.1f}", f"{r['own']:.2f}", f"{r['best']:.2f}"]
        for key in (f"{k}{n}" for n in ns for k in ("last", "best")):
            v = r[key]
            cells.append("-" if v is None else f"{v:.2f} ({v - r['best']:+.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--n", type=int, nargs="+", default=[3, 5], help="window sizes")
    ap.add_argument("--every", type=int, default=2, help="read every this many epochs")
    args = ap.parse_args()
    read = rows(args.run, args.n, args.every)
    (args.run / FOLDER).mkdir(exist_ok=True)
    (args.run / FOLDER / "readings.json").write_text(json.dumps(read, indent=1) + "\n")
    print(table(read, args.n))


if __name__ == "__main__":
    main()
