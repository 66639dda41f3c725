"""The parts of bench/gpu_check.py that run `python run.py` in a subprocess, as a user or a job
script does: SIGTERM and `resume=true`, and DDP over every visible GPU (Lightning's DDP
launches the script again for each further rank, so it cannot run inside the check's process).

Both read the runs' own records: the progress lines (`trainer.progress=json`), the exit status,
summary.json and csv/metrics.csv."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from gpu_common import FP32, ROOT, Plan, Report, run_overrides
from gpu_parity import TOLERANCES, parity_overrides

EX_TEMPFAIL = 75  # what run.py exits with after a signal, once last.ckpt is written
TIMEOUT_S = 300  # one subprocess run; a hung run fails its row instead of the whole check


def run_py(overrides: list[str], run_dir: Path, sigterm_after: int = 0) -> dict[str, Any]:
    """`python run.py OVERRIDES hydra.run.dir=RUN_DIR`; with `sigterm_after` k, SIGTERM once
    its progress lines show update k. Returns the exit status, the last update seen, the
    signal's update and the output's tail."""
    cmd = [sys.executable, str(ROOT / "run.py"), *overrides, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # progress lines as they happen
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    # a hung run (no output at all) is killed too, and fails its row
    watchdog = threading.Timer(TIMEOUT_S, proc.kill)
    watchdog.start()
    tail: list[str] = []
    first, last, signalled = 0, 0, None
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = [*tail[-40:], line]
        record = _record(line)
        if record.get("kind") == "update":
            last = int(record["updates"])
            first = first or last
            if sigterm_after and signalled is None and last >= sigterm_after:
                proc.send_signal(signal.SIGTERM)
                signalled = last
    rc = proc.wait()
    watchdog.cancel()
    if rc == -signal.SIGKILL:
        tail.append(f"(killed after {TIMEOUT_S} s)\n")
    return {
        "rc": rc,
        "first_update": first,
        "last_update": last,
        "signalled_at": signalled,
        "tail": "".join(tail),
    }


def _record(line: str) -> dict[str, Any]:
    """A `trainer.progress=json` line as a dict; {} for any other line."""
    if not line.startswith("{"):
        return {}
    try:
        record = json.loads(line)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _last_loss(run_dir: Path) -> float:
    from convseq.evaluation.history import METRICS_FILE, read_metrics

    rows = read_metrics(run_dir / "csv" / METRICS_FILE)
    updates = sorted((r for r in rows if "train/loss" in r), key=lambda r: r["step"])
    return float(updates[-1]["train/loss"]) if updates else float("nan")


def _fail(report: Report, name: str, what: str, run: dict[str, Any]) -> None:
    print(f"gpu_check: {name}: {what}; the run's last lines:\n{run['tail']}", flush=True)
    report.row(name, what, False)


# -- SIGTERM and resume -----------------------------------------------------------------------
def resume_check(report: Report, plan: Plan, base: list[str], out: Path) -> None:
    """SIGTERM after a third of the updates: exit 75 and last.ckpt; `resume=true` finishes;
    its final loss equals an uninterrupted run's within the fp32 parity tolerance."""
    name = "SIGTERM, resume=true"
    n, k = plan.resume_updates, max(plan.resume_updates // 3, 1)
    overrides = [
        *base,
        *run_overrides(plan.device, FP32, 0, False),
        *parity_overrides(n),  # dropout 0: the CPU and GPU generators aside, nothing random
        "trainer.tf32=false",  # full fp32: the comparison's tolerance is fp32's
    ]
    run_dir = out / "resume"
    print(f"gpu_check: SIGTERM after update {k} of {n}, then resume=true", flush=True)
    # The uninterrupted run, the same command in a subprocess of its own beside the two others
    # (a thread only waits on it): the start-up of three processes overlaps.
    straight: dict[str, Any] = {}
    ref_dir = out / "resume-ref"
    reference = threading.Thread(
        target=lambda: straight.update(run_py([*overrides, "trainer.progress=none"], ref_dir))
    )
    reference.start()
    failed = _interrupt_and_resume(report, overrides, run_dir, n, k)
    reference.join()
    if failed is not None:
        return _fail(report, name, *failed)
    if straight["rc"] != 0:
        return _fail(report, name, f"the uninterrupted run: exit {straight['rc']}", straight)
    figures = report.figures["resume"]
    resumed, plain = _last_loss(run_dir), _last_loss(ref_dir)
    rel = abs(resumed - plain) / abs(plain)
    tol = TOLERANCES[FP32][1]
    figures.update({"loss": resumed, "uninterrupted_loss": plain, "rel": rel, "tol": tol})
    report.row(
        name,
        f"exit {EX_TEMPFAIL} at update {figures['stopped_at']}/{n}, resumed to {n}; "
        f"loss@{n} vs uninterrupted {rel:.1e} (tol {tol:.0e})",
        rel <= tol,
    )


def _interrupt_and_resume(
    report: Report, overrides: list[str], run_dir: Path, n: int, k: int
) -> tuple[str, dict[str, Any]] | None:
    """The run stopped by SIGTERM after update `k`, then `resume=true` to update `n`; their
    figures in report.figures["resume"]. None when both behaved, else (what failed, the run)."""
    first = run_py([*overrides, "trainer.progress=json"], run_dir, sigterm_after=k)
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    figures: dict[str, Any] = {"updates": n, "sigterm_after": first["signalled_at"]}
    figures["first_exit"] = first["rc"]
    report.figures["resume"] = figures
    if first["signalled_at"] is None or first["rc"] != EX_TEMPFAIL or not ckpt.is_file():
        what = (
            f"after SIGTERM at update {first['signalled_at']}: exit {first['rc']} "
            f"(expected {EX_TEMPFAIL}), last.ckpt {'present' if ckpt.is_file() else 'missing'}"
        )
        return what, first
    figures["stopped_at"] = _summary(run_dir).get("updates")
    second = run_py([*overrides, "trainer.progress=json", "resume=true"], run_dir)
    summary = _summary(run_dir)
    figures["resumed_exit"] = second["rc"]
    figures["resumed_updates"] = summary.get("updates")
    figures["resumed_first_update"] = second["first_update"]
    # it continued (its first update follows the checkpoint's), rather than starting again
    continued = summary.get("resumed_from") and second["first_update"] == figures["stopped_at"] + 1
    if second["rc"] != 0 or summary.get("updates") != n or not continued:
        what = (
            f"resume=true: exit {second['rc']}, {summary.get('updates')} of {n} updates, "
            f"first update {second['first_update']} after {figures['stopped_at']}"
        )
        return what, second
    return None


# -- DDP over every visible GPU ---------------------------------------------------------------
def ddp_check(report: Report, plan: Plan, base: list[str], out: Path, one: dict) -> None:
    """`trainer=ddp trainer.devices=N` over every GPU (gloo processes in the dry run): it
    finishes its updates; its updates per second beside the one-device fp32 run's (`one`)."""
    from gpu_train import steady_ups

    name = f"ddp, {plan.ddp_devices} processes" if plan.ddp_devices else "ddp"
    if not plan.ddp_devices:
        report.figures["ddp"] = {"skipped": "one GPU"}
        report.skip(name, "skip: one GPU")
        return
    accelerator = "gpu" if plan.device == "cuda" else "cpu"
    overrides = [
        *base,
        "trainer=ddp",
        f"trainer.accelerator={accelerator}",  # cpu: gloo, the dry run
        f"trainer.devices={plan.ddp_devices}",
        f"max_update={plan.ddp_updates}",
        "trainer.max_epochs=0",
        "trainer.log_every_n_steps=1",
        "trainer.limit_val_batches=2",
        "trainer.progress=json",
        "bleu_every_n_epochs=0",
        "final_test=false",
    ]
    run_dir = out / "ddp"
    print(f"gpu_check: DDP, {plan.ddp_devices} {accelerator} processes", flush=True)
    run = run_py(overrides, run_dir)
    summary = _summary(run_dir)
    if run["rc"] != 0 or summary.get("updates") != plan.ddp_updates:
        what = f"exit {run['rc']}, {summary.get('updates')} of {plan.ddp_updates} updates"
        report.figures["ddp"] = {"exit": run["rc"], "updates": summary.get("updates")}
        return _fail(report, name, what, run)
    from convseq.evaluation.history import METRICS_FILE, read_metrics

    rows = read_metrics(run_dir / "csv" / METRICS_FILE)
    ups = steady_ups(sorted((r for r in rows if "train/loss" in r), key=lambda r: r["step"]))
    base_ups = steady_ups(one["updates"])
    report.figures["ddp"] = {
        "processes": plan.ddp_devices,
        "updates": summary["updates"],
        "ups": ups,
        "one_device_ups": base_ups,
        "exit": run["rc"],
    }
    report.row(
        name,
        f"finished {summary['updates']} updates; {ups:.2f} upd/s vs {base_ups:.2f} on one "
        f"device ({plan.ddp_devices}x the tokens an update)",
        True,
    )
