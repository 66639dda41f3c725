"""Benchmark: processes sharing one machine, each with its share of the cores (the thread rule of
`convseq.common.threads`), against the same work alone.

(a) sweep: a 2-job sweep run in parallel on this machine (`python run.py -m
    hydra/launcher=submitit_local optim=nag,sgd`) against one job alone (`optim=nag`); the figure
    is each job's training time / the job alone (the goal: within 2.5x on 2 cores, where the
    jobs took 10-28x when each took every core).
(b) ddp: two torchrun "nodes" on loopback (`torchrun --nnodes 2 --nproc-per-node 1
    --master-addr 127.0.0.1`, one process each) against Lightning's own one-node two-process run
    (`trainer=ddp trainer.devices=2`); the figure is the ratio of their training times (the
    goal: within 1.5x), and the final weights (last.ckpt) must be equal bit for bit.

Every run is a fresh `python run.py` on the toy corpus; no thread variable is set for them
(OMP_NUM_THREADS is removed from their environment: the rule alone decides). Each repeat runs
the pair in alternating order, and every figure is the median over the repeats; training time
is summary.json's `train_seconds` (the updates and validations, not the start-up).

    python bench/bench_parallel_jobs.py                  # both parts, 3 repeats
    python bench/bench_parallel_jobs.py --part sweep --repeats 1 --json
    python bench/bench_parallel_jobs.py --dry-run        # the commands only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
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
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def child_env() -> dict[str, str]:
    """This environment minus every thread setting and inherited rank: the rule decides."""
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LOCAL_RANK", "RANK", "WORLD_SIZE"):
        env.pop(key, None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the commands -------------------------------------------------------------------------------
def sweep_commands(work: Path, epochs: int) -> dict[str, list[list[str]]]:
    """(a): the job alone, and the 2-job sweep (one command each)."""
    common = [f"trainer.max_epochs={epochs}", "gen.test_bleu=false", "final_test=false"]
    return {
        "alone": [[sys.executable, RUN_PY, "optim=nag", *common, f"hydra.run.dir={work}/alone"]],
        "sweep": [
            [
                sys.executable,
                RUN_PY,
                "-m",
                "hydra/launcher=submitit_local",
                "optim=nag,sgd",
                *common,
                f"hydra.sweep.dir={work}/sweep",
            ]
        ],
    }


def ddp_commands(work: Path, epochs: int, port: int) -> dict[str, list[list[str]]]:
    """(b): Lightning's one-node two-process run, and two torchrun nodes (one command each)."""
    common = [
        "trainer=ddp",
        "trainer.accelerator=cpu",
        f"trainer.max_epochs={epochs}",
        "gen.test_bleu=false",
        "final_test=false",
    ]
    lightning = [sys.executable, RUN_PY, *common, "trainer.devices=2", f"hydra.run.dir={work}/ln"]
    nodes = [
        [
            TORCHRUN,
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--node-rank",
            str(rank),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            RUN_PY,
            *common,
            "trainer.num_nodes=2",
            "trainer.devices=1",
            f"hydra.run.dir={work}/tr",
        ]
        for rank in (0, 1)
    ]
    return {"lightning": [lightning], "torchrun": nodes}


# -- running ------------------------------------------------------------------------------------
def run_together(cmds: list[list[str]], log: Path) -> float:
    """Start `cmds` at once (the processes of one run); wall seconds until all ended."""
    t0 = time.perf_counter()
    procs = []
    for i, cmd in enumerate(cmds):
        out = open(log.with_name(f"{log.name}.{i}"), "w")  # noqa: SIM115 (closed below)
        procs.append(
            (
                subprocess.Popen(
                    cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT
                ),
                out,
            )
        )
    failed = []
    for (proc, out), cmd in zip(procs, cmds):
        if proc.wait(timeout=3600) != 0:
            failed.append((cmd, out.name))
        out.close()
    if failed:
        tail = Path(failed[0][1]).read_text()[-3000:]
        raise SystemExit(f"failed: {' '.join(failed[0][0])}\n{tail}")
    return time.perf_counter() - t0


def summaries(folder: Path) -> list[dict[str, Any]]:
    """Every summary.json under `folder` (one per job)."""
    return [json.loads(p.read_text()) for p in sorted(folder.rglob("summary.json"))]


def threads_line(folder: Path) -> str:
    """The run's last threads line (the header's, or the one DDP ranks settle on once they know
    each other), to show which rule applied."""
    found = "?"
    for log in sorted(folder.rglob("*.log")) + sorted(folder.rglob("*_log.out")):
        for line in log.read_text(errors="replace").splitlines():
            if "threads per process" in line:
                found = line.split(" - ", 1)[-1]
        if found != "?":
            return found
    return found


def final_weights(ckpt: Path) -> dict[str, Any]:
    import torch

    return torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]


def bit_equal(a: Path, b: Path) -> bool:
    import torch

    wa, wb = final_weights(a), final_weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def sweep_part(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    alone, jobs, threads = [], [], {}
    for r in range(args.repeats):
        order = ("alone", "sweep") if r % 2 == 0 else ("sweep", "alone")
        for name in order:
            folder = work / f"sweep{r}"
            cmds = sweep_commands(folder, args.epochs)[name]
            run_together(cmds, work / f"sweep{r}-{name}.log")
            sums = summaries(folder / name)
            threads[name] = (
                threads_line(folder / name) if name == "alone" else threads_line(folder / "sweep")
            )
            seconds = [s["train_seconds"] for s in sums]
            (alone if name == "alone" else jobs).append(seconds)
            print(
                f"  repeat {r + 1} {name}: train seconds {', '.join(f'{s:.1f}' for s in seconds)}",
                flush=True,
            )
        shutil.rmtree(work / f"sweep{r}", ignore_errors=True)
    t_alone = statistics.median(s[0] for s in alone)
    t_jobs = [statistics.median(s[i] for s in jobs) for i in range(2)]
    return {
        "alone_s": t_alone,
        "jobs_s": t_jobs,
        "ratio_per_job": [t / t_alone for t in t_jobs],
        "threads": threads,
    }


def ddp_part(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    times: dict[str, list[float]] = {"lightning": [], "torchrun": []}
    equal, threads = [], {}
    for r in range(args.repeats):
        order = ("lightning", "torchrun") if r % 2 == 0 else ("torchrun", "lightning")
        folder = work / f"ddp{r}"
        cmds = ddp_commands(folder, args.epochs, free_port())
        for name in order:
            run_together(cmds[name], work / f"ddp{r}-{name}.log")
            sub = folder / ("ln" if name == "lightning" else "tr")
            times[name].append(summaries(sub)[0]["train_seconds"])
            threads[name] = threads_line(sub)
            print(f"  repeat {r + 1} {name}: train seconds {times[name][-1]:.1f}", flush=True)
        last = "checkpoints/last.ckpt"
        equal.append(bit_equal(folder / "ln" / last, folder / "tr" / last))
        shutil.rmtree(folder, ignore_errors=True)
    t_ln, t_tr = statistics.median(times["lightning"]), statistics.median(times["torchrun"])
    return {
        "lightning_s": t_ln,
        "torchrun_s": t_tr,
        "ratio": t_tr / t_ln,
        "weights_bit_equal": all(equal),
        "threads": threads,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--part", choices=("sweep", "ddp", "both"), default="both")
    p.add_argument("--epochs", type=int, default=1, help="epochs of the toy run (250 updates each)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true", help="print the result as JSON at the end")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    info = machine()
    print(machine_line(info), flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench_parallel_jobs-"))
    parts = ("sweep", "ddp") if args.part == "both" else (args.part,)
    if args.dry_run:
        for part in parts:
            groups = (
                sweep_commands(work, args.epochs)
                if part == "sweep"
                else ddp_commands(work, args.epochs, 29500)
            )
            for name, cmds in groups.items():
                for cmd in cmds:
                    print(f"{part} {name}: {' '.join(cmd)}")
        shutil.rmtree(work, ignore_errors=True)
        return
    result: dict[str, Any] = {"machine": info, "epochs": args.epochs, "repeats": args.repeats}
    try:
        if "sweep" in parts:
            s = result["sweep"] = sweep_part(args, work)
            print(
                f"(a) 2-job sweep on this machine: jobs {s['jobs_s'][0]:.1f} s, {s['jobs_s'][1]:.1f} s"
                f" vs {s['alone_s']:.1f} s alone: {s['ratio_per_job'][0]:.2f}x, "
                f"{s['ratio_per_job'][1]:.2f}x (goal <= 2.5x)",
                flush=True,
            )
            print(f"    threads: {s['threads']}", flush=True)
        if "ddp" in parts:
            d = result["ddp"] = ddp_part(args, work)
            print(
                f"(b) two torchrun nodes {d['torchrun_s']:.1f} s vs Lightning's two processes "
                f"{d['lightning_s']:.1f} s: {d['ratio']:.2f}x (goal <= 1.5x); weights bit-equal: "
                f"{d['weights_bit_equal']}",
                flush=True,
            )
            print(f"    threads: {d['threads']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
