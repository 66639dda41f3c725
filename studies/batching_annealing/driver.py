"""Run the arms of the batching x annealing x momentum study (readings.md) to their own stop.

Every arm is one `python run.py experiment=multi30k_study ...` run in its own folder under
`--root` (default `outputs/study/<arm>`). The script is safe to start again at any time: an arm
with a finished `summary.json` is skipped, one with `checkpoints/last.ckpt` but no finished summary
(a session end, a kill) continues with `resume=true`, any other starts fresh. The `force` arms
start annealing at the epoch where the `lua` arm of the same batching first trained with a smaller
lr, so they run after it. Two drivers (``--queue 1/2`` and ``2/2``) each run their own queue first,
then help with the other's; a lock per arm (``<arm>/.study.lock``, released by the kernel when
its driver dies) keeps two drivers off one arm.

    OMP_NUM_THREADS=1 CONVSEQ_DATA_ROOT=../shared/data python -m studies.batching_annealing.driver --queue 1/2 &
    OMP_NUM_THREADS=1 CONVSEQ_DATA_ROOT=../shared/data python -m studies.batching_annealing.driver --queue 2/2 &
    python -m studies.batching_annealing.driver --list             # each arm's state, epochs, lr
    python -m studies.batching_annealing.driver --time-epochs 3    # seconds per epoch, quiet machine
    CONVSEQ_DATA_ROOT=../shared/data python -m studies.batching_annealing.report

On CPU with a fixed seed and a fixed thread count an arm's epochs, losses and BLEU do not depend
on the machine's load, so two queues of one thread each may share two cores; their seconds per
epoch are measured apart, on a quiet machine (readings.md). Run it from the project folder
(``python -m``: the package `studies` is found there).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the project folder: run.py lives here


@dataclass(frozen=True)
class Arm:
    name: str  # the run folder's name under --root
    overrides: tuple[str, ...]  # Hydra overrides on top of experiment=multi30k_study
    force_from: str | None = None  # force arms: the lua arm whose first annealed epoch they use


def _arm(name: str, *overrides: str, force_from: str | None = None) -> Arm:
    return Arm(name, tuple(overrides), force_from)


# plain SGD at NAG's lr takes a step ~100x smaller and is not expected to anneal at all: its
# safety net is 60 epochs (well past every NAG arm's stop), not the study's 150, so that its curve
# is shown without spending 150 epochs on it; the report calls it "did not anneal within 60 epochs"
SGD_CAP_EPOCHS = 60
SGD = ("optim=sgd", "optim.momentum=0")
SGD_SMALL_STEP = (*SGD, f"trainer.max_epochs={SGD_CAP_EPOCHS}")
# lr 25 = 0.25 / (1 - 0.99): the step plain SGD needs to match NAG 0.99's steady-state step;
# min_lr scaled by the same 100x so the annealing rules still stop after the same number of shrinks.
SGD_MATCHED = (*SGD, "optim.lr=25", "anneal.min_lr=0.001")

# Two queues, in the order each runs them; the end points (tokens+plateau: the PyTorch toolkit's
# way, sentences+lua: the Lua toolkit's way) get seeds 2 and 3 and the momentum-free arms, which
# come last: the headline difference and its seed spread are ready first.
QUEUES: tuple[tuple[Arm, ...], ...] = (
    (
        _arm("tok_lua_s1", "batching=tokens", "anneal=lua", "seed=1"),
        _arm("tok_plateau_s1", "batching=tokens", "anneal=plateau", "seed=1"),
        _arm("tok_force_s1", "batching=tokens", "anneal=force", "seed=1", force_from="tok_lua_s1"),
        _arm("tok_plateau_s2", "batching=tokens", "anneal=plateau", "seed=2"),
        _arm("tok_plateau_sgd25_s1", "batching=tokens", "anneal=plateau", "seed=1", *SGD_MATCHED),
        _arm("tok_plateau_sgd_s1", "batching=tokens", "anneal=plateau", "seed=1", *SGD_SMALL_STEP),
    ),
    (
        _arm("sen_lua_s1", "batching=sentences", "anneal=lua", "seed=1"),
        _arm("sen_plateau_s1", "batching=sentences", "anneal=plateau", "seed=1"),
        _arm(
            "sen_force_s1", "batching=sentences", "anneal=force", "seed=1", force_from="sen_lua_s1"
        ),
        _arm("sen_lua_s2", "batching=sentences", "anneal=lua", "seed=2"),
        _arm("sen_lua_s3", "batching=sentences", "anneal=lua", "seed=3"),
        # the third token seed runs here so that both end points' seeds finish before the
        # momentum-free arms (queue 1 has the longer token arms)
        _arm("tok_plateau_s3", "batching=tokens", "anneal=plateau", "seed=3"),
        _arm("sen_lua_sgd25_s1", "batching=sentences", "anneal=lua", "seed=1", *SGD_MATCHED),
        _arm("sen_lua_sgd_s1", "batching=sentences", "anneal=lua", "seed=1", *SGD_SMALL_STEP),
    ),
)
ARMS = {arm.name: arm for queue in QUEUES for arm in queue}


def state(run_dir: Path) -> str:
    """done | interrupted (resume it) | new."""
    summary = run_dir / "summary.json"
    if summary.is_file() and not json.loads(summary.read_text()).get("interrupted", False):
        return "done"
    if (run_dir / "checkpoints" / "last.ckpt").is_file():
        return "interrupted"
    return "new"


def is_running(run_dir: Path) -> bool:
    """Whether a driver holds the arm's lock now (it is training that arm)."""
    if not (run_dir / ".study.lock").is_file():  # never run: arm_lock would make its folder
        return False
    with arm_lock(run_dir) as mine:
        return not mine


def progress(run_dir: Path) -> str:
    """How far an arm's run has got: its epochs finished and the lr of the last one, read from
    ``csv/metrics.csv`` as the report reads an unfinished run; "" before its first epoch ends."""
    from convseq.evaluation.history import history_from_metrics

    epochs = history_from_metrics(run_dir / "csv" / "metrics.csv")
    trained = [row for row in epochs if "train_epoch/lr" in row]
    if not trained:
        return ""
    return f"{trained[-1]['epoch']} epochs, lr {trained[-1]['train_epoch/lr']:g}"


def first_annealed_epoch(run_dir: Path) -> int:
    """The first epoch trained with an lr below the first epoch's (from summary.json's history)."""
    from .runs import anneal_start  # the study report's own rule

    history = json.loads((run_dir / "summary.json").read_text())["history"]
    rows = [row for row in history if "train_epoch/lr" in row]
    epoch = anneal_start([int(r["epoch"]) for r in rows], [r["train_epoch/lr"] for r in rows])
    if epoch is None:
        raise SystemExit(
            f"{run_dir}/summary.json: the lr never fell below {rows[0]['train_epoch/lr']}: "
            "no anneal epoch"
        )
    return epoch


def command(arm: Arm, root: Path) -> list[str]:
    run_dir = root / arm.name
    args = [sys.executable, str(ROOT / "run.py"), "experiment=multi30k_study", *arm.overrides]
    if arm.force_from is not None:
        args.append(f"anneal.force_anneal={first_annealed_epoch(root / arm.force_from)}")
    args.append(f"hydra.run.dir={run_dir}")
    if state(run_dir) == "interrupted":
        args.append("resume=true")
    return args


def timing_group(arm: Arm) -> tuple[str, ...]:
    """What an epoch's time depends on: the batching and the optimiser (not the annealing rule,
    the lr value or the seed, which change no amount of work)."""
    return tuple(
        o for o in arm.overrides if o.startswith(("batching=", "optim=", "optim.momentum"))
    )


def epoch_seconds(history: list[dict]) -> tuple[list[float], list[float]]:
    """Per epoch of a summary's history: seconds in updates, and the rest of its wall time.

    ``train_epoch/time`` is an epoch's wall time with its validation; the updates' own time is
    the epoch's update count over ``train_epoch/ups`` (updates per second of update time).
    """
    train, valid = [], []
    done = 0  # updates before this epoch
    for row in history:
        updates = int(row["updates"]) - done
        done = int(row["updates"])
        seconds = updates / float(row["train_epoch/ups"])
        train.append(seconds)
        valid.append(max(float(row["train_epoch/time"]) - seconds, 0.0))
    return train, valid


def measure_timing(root: Path, epochs: int, dry_run: bool, rounds: int = 3) -> None:
    """Time `epochs` epochs of one arm per timing group, in `rounds` rounds that take the groups
    in turn (so that a slow spell of a shared machine falls on every group alike), each run with
    2 threads on a quiet machine, in <root>/../study_timing/<group>/round<r>/; then write
    <root>/timing.json for every arm: the median over all timed epochs of a group of the seconds
    of an epoch's updates, and of the rest of its wall time (validation, its BLEU, the
    checkpoints) as validation seconds. Timed runs already finished are read, not run again."""
    groups: dict[tuple[str, ...], list[Arm]] = {}
    for arm in ARMS.values():
        groups.setdefault(timing_group(arm), []).append(arm)
    timing: dict[str, object] = {
        "_note": f"medians of {epochs} timed epochs x {rounds} rounds per batching x optimiser, "
        "the groups taken in turn each round, measured apart on a quiet machine "
        "(python -m studies.batching_annealing.driver --time-epochs); the annealing rule, lr and seed change no work per "
        "epoch"
    }
    seconds: dict[tuple[str, ...], tuple[list[float], list[float]]] = {g: ([], []) for g in groups}
    for r in range(1, rounds + 1):
        for group, arms in groups.items():
            name = "_".join(o.replace("=", "-") for o in group)
            run_dir = root.parent / "study_timing" / name / f"round{r}"
            # the arm's own epoch limit gives way to the timed epochs (Hydra refuses a key twice)
            overrides = [o for o in arms[0].overrides if not o.startswith("trainer.max_epochs=")]
            cmd = [
                sys.executable, str(ROOT / "run.py"), "experiment=multi30k_study", *overrides,
                f"trainer.max_epochs={epochs}", "final_test=false", f"hydra.run.dir={run_dir}",
            ]  # fmt: skip
            print(" ".join(cmd), flush=True)
            if dry_run:
                continue
            if not (run_dir / "summary.json").is_file():
                env = {**os.environ, "OMP_NUM_THREADS": "2"}
                subprocess.run(cmd, check=True, cwd=ROOT, env=env)
            history = json.loads((run_dir / "summary.json").read_text())["history"]
            train, valid = epoch_seconds(history)
            seconds[group][0].extend(train)
            seconds[group][1].extend(valid)
    if dry_run:
        return
    for group, arms in groups.items():
        train, valid = seconds[group]
        for arm in arms:
            timing[arm.name] = {
                "train_seconds_per_epoch": statistics.median(train),
                "valid_seconds_per_epoch": statistics.median(valid),
                "timed_epochs": len(train),
            }
    (root / "timing.json").write_text(json.dumps(timing, indent=2) + "\n")
    print(f"written {root / 'timing.json'}")


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m studies.batching_annealing.driver", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--root", type=Path, default=ROOT / "outputs" / "study")
    parser.add_argument("--queue", default="1/1", help="K/N: run queue K of N (N = 1 or 2)")
    parser.add_argument("--list", action="store_true", help="print every arm's state and stop")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=60.0,
        help="wait between looks when every arm left is busy",
    )
    parser.add_argument(
        "--time-epochs",
        type=int,
        default=0,
        help="N > 0: measure seconds per epoch (N epochs per batching x optimiser) into timing.json",
    )
    parser.add_argument(
        "--time-rounds",
        type=int,
        default=3,
        help="rounds of --time-epochs, the batching x optimiser groups taken in turn each round",
    )
    args = parser.parse_args()
    root = args.root.resolve()
    if args.time_epochs > 0:
        measure_timing(root, args.time_epochs, args.dry_run, args.time_rounds)
        return
    if args.list:
        for arm in ARMS.values():
            run_dir = root / arm.name
            now = "running" if is_running(run_dir) else state(run_dir)
            done = progress(run_dir)
            print(f"{arm.name:24s} {now:12s} {done:22s} {' '.join(arm.overrides)}")
        return
    k, n = (int(x) for x in args.queue.split("/"))
    if n not in (1, 2) or not 1 <= k <= n:
        raise SystemExit(f"--queue {args.queue}: expected 1/1, 1/2 or 2/2")
    order = queue_order(k, n)
    if args.dry_run:
        for arm in order:
            if state(root / arm.name) == "done":
                continue
            if waits_for_lua(arm, root):
                print(f"# {arm.name}: waits for {arm.force_from}")
                continue
            print(" ".join(command(arm, root)), flush=True)
        return
    run_queue(order, root, args.poll_seconds)


def waits_for_lua(arm: Arm, root: Path) -> bool:
    """Whether ``arm`` is a force arm whose lua arm has not finished (its start epoch is unknown)."""
    return arm.force_from is not None and state(root / arm.force_from) != "done"


def queue_order(k: int, n: int) -> list[Arm]:
    """Queue k's arms, then the other queue's: a queue that runs out helps the other one."""
    own = list(QUEUES[k - 1]) if n == 2 else [arm for queue in QUEUES for arm in queue]
    return own + [arm for queue in QUEUES for arm in queue if arm not in own]


@contextlib.contextmanager
def arm_lock(run_dir: Path) -> Iterator[bool]:
    """Hold ``<run_dir>/.study.lock`` while running an arm; yields False when another driver
    holds it. An flock: the kernel releases it when its holder dies, so no lock is ever stale."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".study.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_queue(order: list[Arm], root: Path, poll_seconds: float, run=subprocess.run) -> None:
    """Run the arms of ``order`` that are not done, one at a time, each under its lock.

    An arm another driver is running is passed over, and so is a force arm whose lua arm has
    not finished; when only such arms are left the driver waits ``poll_seconds`` and looks
    again, and it returns once every arm of ``order`` is done.
    """
    told: list[str] = []
    while True:
        pending = [arm for arm in order if state(root / arm.name) != "done"]
        if not pending:
            return
        ran = False
        for arm in pending:
            if waits_for_lua(arm, root):
                continue
            with arm_lock(root / arm.name) as mine:
                if not mine or state(root / arm.name) == "done":
                    continue
                cmd = command(arm, root)
                print(" ".join(cmd), flush=True)
                run(cmd, check=True, cwd=ROOT)
                ran = True
                break  # look at the whole order again: a force arm may have become ready
        if not ran:
            busy = [arm.name for arm in pending]
            if busy != told:  # once per change, not every poll
                print(f"# waiting: {', '.join(busy)} (running elsewhere, or waiting for their "
                      "lua arm)", flush=True)  # fmt: skip
                told = busy
            time.sleep(poll_seconds)


if __name__ == "__main__":
    main()
