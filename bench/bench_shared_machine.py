"""Benchmark: a run that shares its machine with another one, each with the default settings.

On a workstation, a shared CI runner or a cluster node without exclusive cores, a second job is
often running already. A process alone takes every core it may use (`convseq.common.threads`);
beside another busy process, torch's idle OpenMP threads spin between operations and take the
cores the other needs. convseq's answer (`convseq.common.cpu_share`): fewer threads while other
work uses the CPUs, all of them again once it stops.

For each arm (an environment) and each part:

- train: `python run.py max_update=100 final_test=false` on the toy corpus, figure: summary.json's
  `train_seconds` (the updates and validations, not the start-up);
- generate: `python run.py task=generate ckpt=<a toy checkpoint of --ckpt-updates updates>
  gen.input=<the first --sentences (5,000) sources of the toy corpus>` (beam 5), figure: the
  translation's seconds (generate's speed line);

one run alone, then two started together. Each repeat alternates the order (alone first, then
together first) and the arms, and every figure is the median over the repeats. The arms by
default: `convseq` (nothing set) and `fixed` (OMP_NUM_THREADS = this process's CPUs: a thread
on every CPU whatever else runs, what convseq did before it followed the load). The goals: each
of the two within 2.5x of the run alone, and the run alone no slower than `fixed`'s by more
than 3%. Other arms measure the wait settings (they fail one goal or the other here):

    python bench/bench_shared_machine.py                       # both parts, 3 repeats
    python bench/bench_shared_machine.py --part train --repeats 5 --json out.json
    python bench/bench_shared_machine.py --arm passive=OMP_WAIT_POLICY=PASSIVE --arm spin=GOMP_SPINCOUNT=1000
    python bench/bench_shared_machine.py --dry-run             # the commands only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import machine, machine_line  # bench/, beside this script (on sys.path as a script)

ROOT = Path(__file__).resolve().parents[1]
RUN_PY = str(ROOT / "run.py")
# every variable that sets threads or their waiting: an arm's own are added back
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "KMP_BLOCKTIME",
)
# name=VAR=VALUE,VAR=VALUE (an empty list: nothing set, convseq decides); `fixed`: a thread on
# every CPU of this process, set by hand (a number of the user's is not changed by convseq)
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
DEFAULT_ARMS = ("convseq=", f"fixed=OMP_NUM_THREADS={CPUS}")
SECONDS = re.compile(r" in ([0-9.]+) ?s\b")  # generate's speed line: "Translated ... in 4.3s (..."


def parse_arm(text: str) -> tuple[str, dict[str, str]]:
    """'name=VAR=VALUE,VAR=VALUE' -> (name, {VAR: VALUE}); 'name=' sets nothing."""
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--arm {text!r}: give NAME=VAR=VALUE[,VAR=VALUE] or NAME= (nothing set)")
    env = {}
    for item in filter(None, rest.split(",")):
        var, sep, value = item.partition("=")
        if not sep or var not in THREAD_VARIABLES:
            raise SystemExit(
                f"--arm {text!r}: {item!r} is not one of {', '.join(THREAD_VARIABLES)}=VALUE"
            )
        env[var] = value
    return name, env


def child_env(arm: dict[str, str], cache: Path) -> dict[str, str]:
    """This environment without any thread or wait setting, plus the arm's own."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    env.update(arm, PYTHONUNBUFFERED="1", CONVSEQ_CACHE=str(cache))
    return env


def train_command(out: Path, updates: int) -> list[str]:
    return [
        sys.executable,
        RUN_PY,
        f"max_update={updates}",
        "final_test=false",
        f"hydra.run.dir={out}",
    ]


def generate_command(ckpt: Path, source: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        RUN_PY,
        "task=generate",
        f"ckpt={ckpt}",
        f"gen.input={source}",
        f"hydra.run.dir={out}",
    ]


def run_together(cmds: list[list[str]], env: dict[str, str], logs: list[Path]) -> list[str]:
    """Start `cmds` at once; their outputs once all ended (a failure stops the benchmark)."""
    procs = []
    for cmd, log in zip(cmds, logs):
        with open(log, "w") as f:
            procs.append(
                subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            )
    for proc, cmd, log in zip(procs, cmds, logs):
        if proc.wait(timeout=3600) != 0:
            raise SystemExit(f"failed: {' '.join(cmd)}\n{log.read_text()[-3000:]}")
    return [log.read_text(errors="replace") for log in logs]


def train_seconds(out: Path, _printed: str) -> float:
    return float(json.loads((out / "summary.json").read_text())["train_seconds"])


def generate_seconds(_out: Path, printed: str) -> float:
    lines = [line for line in printed.splitlines() if line.startswith("Translated ")]
    found = SECONDS.search(lines[-1]) if lines else None
    if found is None:
        raise SystemExit(f"no speed line in generate's output:\n{printed[-2000:]}")
    return float(found.group(1))


def wait_line(printed: str) -> str:
    """What the run said about its threads and their waiting (the header's line)."""
    lines = [line for line in printed.splitlines() if "threads per process" in line]
    return lines[-1].split("convseq: ", 1)[-1].strip() if lines else "?"


def one_round(
    part: dict[str, Any], env: dict[str, str], work: Path, tag: str, alone_first: bool
) -> dict[str, Any]:
    """The run alone and two together (the run alone first or last); each run's figure."""
    order = ("alone", "together") if alone_first else ("together", "alone")
    figures: dict[str, Any] = {}
    for name in order:
        outs = [work / f"{tag}-{name}-{i}" for i in range(1 if name == "alone" else 2)]
        cmds = [part["command"](out) for out in outs]
        printed = run_together(cmds, env, [out.with_suffix(".log") for out in outs])
        figures[name] = [part["seconds"](out, text) for out, text in zip(outs, printed)]
        figures["said"] = wait_line(printed[0])
    return figures


def make_checkpoint(
    work: Path, env: dict[str, str], updates: int, sentences: int
) -> tuple[Path, Path]:
    """A toy checkpoint for the generate part (trained once, with the arm-free environment), and
    the first `sentences` source lines of the toy corpus's training side to translate."""
    out = work / "checkpoint-run"
    run_together([train_command(out, updates)], env, [work / "checkpoint-run.log"])
    corpus = next((work / "cache" / "corpora").glob("toy-seed*/train.src"))
    lines = corpus.read_text(encoding="utf-8").splitlines()[:sentences]
    source = work / "source.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out / "checkpoints" / "last.ckpt", source


def parts(
    args: argparse.Namespace, work: Path, ckpt: tuple[Path, Path] | None
) -> dict[str, dict[str, Any]]:
    chosen = ("train", "generate") if args.part == "both" else (args.part,)
    table = {
        "train": {
            "command": lambda out: train_command(out, args.updates),
            "seconds": train_seconds,
        },
        "generate": {
            "command": lambda out: generate_command(*ckpt, out),
            "seconds": generate_seconds,
        },
    }
    return {name: table[name] for name in chosen}


def summarise(figures: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats: alone, each of the two together, their ratios to alone."""
    alone = statistics.median(f["alone"][0] for f in figures)
    first = statistics.median(max(f["together"]) for f in figures)  # the slower of the two
    second = statistics.median(min(f["together"]) for f in figures)
    return {
        "alone_s": alone,
        "together_s": [first, second],
        "ratio": [first / alone, second / alone],
        "rounds": figures,
        "said": figures[-1]["said"],
    }


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    arms = dict(parse_arm(a) for a in args.arm or DEFAULT_ARMS)
    cache = work / "cache"
    ckpt = None
    if args.part in ("both", "generate"):
        ckpt = make_checkpoint(work, child_env({}, cache), args.ckpt_updates, args.sentences)
    results: dict[str, Any] = {}
    for part_name, part in parts(args, work, ckpt).items():
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
        for r in range(args.repeats):
            names = list(arms) if r % 2 == 0 else list(reversed(arms))  # alternate the arms too
            for name in names:
                tag = f"{part_name}-{name}-r{r}"
                got = one_round(part, child_env(arms[name], cache), work, tag, r % 2 == 0)
                rounds[name].append(got)
                print(
                    f"  {tag}: alone {got['alone'][0]:.1f} s, together {got['together']}",
                    flush=True,
                )
        results[part_name] = {name: summarise(f) for name, f in rounds.items()}
    return {"arms": arms, "parts": results}


def report(result: dict[str, Any], baseline: str) -> str:
    lines = []
    for part_name, arms in result["parts"].items():
        base = arms.get(baseline, {}).get("alone_s")
        lines.append(
            f"{part_name}: arm | alone s | together s (each) | together / alone | alone vs {baseline}"
        )
        for name, s in arms.items():
            vs = f"{(s['alone_s'] / base - 1) * 100:+.1f}%" if base else "n/a"
            together = " and ".join(f"{t:.1f}" for t in s["together_s"])
            ratio = " and ".join(f"{x:.2f}x" for x in s["ratio"])
            lines.append(
                f"  {name} | {s['alone_s']:.1f} | {together} | {ratio} | {vs}   [{s['said']}]"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--part", choices=("train", "generate", "both"), default="both")
    p.add_argument("--repeats", type=int, default=3, help="alternating rounds; figures are medians")
    p.add_argument("--updates", type=int, default=100, help="updates of each training run")
    p.add_argument(
        "--arm",
        action="append",
        help="NAME=VAR=VALUE[,...] (repeatable); default: " + " and ".join(DEFAULT_ARMS),
    )
    p.add_argument(
        "--ckpt-updates",
        type=int,
        default=750,
        help="updates of the generate part's checkpoint (a model that translates whole sentences)",
    )
    p.add_argument(
        "--sentences", type=int, default=5000, help="sentences each generate run translates"
    )
    p.add_argument("--json", help="write the figures and the machine here")
    p.add_argument("--work", help="keep the runs in this folder (default: a temporary one)")
    p.add_argument("--dry-run", action="store_true", help="print the commands and arms only")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(machine_line(), flush=True)
    arms = dict(parse_arm(a) for a in args.arm or DEFAULT_ARMS)
    if args.dry_run:
        work = Path(args.work or "WORK")
        for name, env in arms.items():
            print(f"arm {name}: {' '.join(f'{k}={v}' for k, v in env.items()) or '(nothing set)'}")
        print(f"train: {' '.join(train_command(work / 'run', args.updates))}")
        cmd = generate_command(work / "ckpt.ckpt", work / "source.txt", work / "gen")
        print(f"generate: {' '.join(cmd)}")
        return
    with tempfile.TemporaryDirectory(prefix="convseq-shared-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        result = measure(args, work)
    print(report(result, baseline=list(arms)[-1] if len(arms) > 1 else list(arms)[0]))
    print(f"{time.perf_counter() - t0:.0f} s in all")
    if args.json:
        result["machine"] = machine()
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
