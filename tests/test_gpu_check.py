"""bench/gpu_check.py: its dry run (the GPU check's code path on the CPU) and its refusal
without a GPU. The dry run keeps the script from rotting on machines that have no GPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from convseq.inference.precision import cpu_has

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"
sys.path.insert(0, str(ROOT / "bench"))
from machine import machine, machine_line  # noqa: E402

ROWS = [
    "parity fp32 vs CPU",
    "parity bf16-mixed vs CPU",
    "parity 16-mixed vs CPU",
    "train fp32",
    "train bf16-mixed",
    "train 16-mixed",
    "big preset fp32",
    "big preset bf16-mixed",
    "big preset 16-mixed",
    "beam 5 cpu vs CPU",
    "translate beam 1, batch 128",
    "translate beam 5, batch 128",
    "translate beam 5, gen.precision=bf16",
    "end-of-training test device",
    "SIGTERM, resume=true",
    "ddp, 2 processes",
    "lightconv train fp32",
    "lightconv train bf16-mixed",
    "lightconv train 16-mixed",
    "lightconv beam 5 cpu vs CPU",
    "lightconv translate beam 5, batch 128",
    "lightconv beam 5, gen.precision=bf16",
]
# a dry run trains in bf16-mixed only where this CPU has bf16 arithmetic (AVX-512 BF16)
BF16 = cpu_has("bf16")
TRAINED = ("fp32", "bf16-mixed") if BF16 else ("fp32",)
BF16_ROWS = {
    "parity bf16-mixed vs CPU",
    "train bf16-mixed",
    "big preset bf16-mixed",
    "lightconv train bf16-mixed",
}
CHECKS = [
    "parity fp32 vs CPU",
    *(["parity bf16-mixed vs CPU"] if BF16 else []),
    "end-of-training test device",
    "beam 5 cpu vs CPU",
    "SIGTERM, resume=true",
    "ddp, 2 processes",
    "lightconv beam 5 cpu vs CPU",
]
# the parts that start `python run.py` subprocesses (SIGTERM + resume=true, trainer=ddp): the
# default run's dry run leaves them out (--skip), their run.py paths being covered by
# tests/training/test_slurm_requeue.py and test_ddp_resume.py (run.py trainer=ddp); the whole
# dry run is slow
RUNPY_PARTS = ("resume", "ddp")
RUNPY_ROWS = {"SIGTERM, resume=true", "ddp, 2 processes"}


def run_script(args: list[str], cache: Path, timeout: float) -> subprocess.CompletedProcess:
    # A private cache: the dry run's data-bin never lands in the user's ~/.cache/convseq.
    env = {**os.environ, "CONVSEQ_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _dry_run(tmp: Path, *extra: str) -> dict[str, Any]:
    out_json = tmp / "out.json"
    args = ["--dry-run", "--budget", "--json", str(out_json), *extra]
    proc = run_script(args, tmp / "cache", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"stdout": proc.stdout, "json": json.loads(out_json.read_text())}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> dict[str, Any]:
    """The dry run without the run.py parts (`--skip resume --skip ddp`)."""
    skips = [a for part in RUNPY_PARTS for a in ("--skip", part)]
    return _dry_run(tmp_path_factory.mktemp("gpu_check"), *skips)


def table_rows(stdout: str) -> dict[str, str]:
    """The table's rows by check name: {name: status}."""
    rows = {}
    for line in stdout.splitlines():
        for name in ROWS:
            if line.startswith(name + "  "):
                rows[name] = line.split()[-1]
    return rows


def test_dry_run_prints_the_table(dry_run):
    out = dry_run["stdout"]
    assert "DRY RUN on the CPU" in out
    assert f"torch {torch.__version__}" in out
    rows = table_rows(out)
    assert set(rows) == set(ROWS) - RUNPY_ROWS  # --skip leaves out exactly their rows
    assert rows["parity fp32 vs CPU"] == "PASS"
    assert rows["parity bf16-mixed vs CPU"] == ("PASS" if BF16 else "skip")
    assert rows["beam 5 cpu vs CPU"] == "PASS"
    assert rows["end-of-training test device"] == "PASS"
    skipped = {name for name, status in rows.items() if status == "skip"}
    sixteen = {
        "train 16-mixed",
        "big preset 16-mixed",
        "parity 16-mixed vs CPU",
        "lightconv train 16-mixed",
    }
    if BF16:
        assert skipped == sixteen
    else:
        bf16_gen = {"translate beam 5, gen.precision=bf16", "lightconv beam 5, gen.precision=bf16"}
        assert skipped == {*sixteen, *BF16_ROWS, *bf16_gen}
    assert "all checks passed" in out
    # each row also printed as it is made: a run cut by a time limit still shows it
    assert "gpu_check: row | beam 5 cpu vs CPU | 8/8 identical" in out


def test_dry_run_table_names_the_machine_first(dry_run):
    info = dry_run["json"]["machine"]
    assert info["model"] == machine()["model"]
    lines = dry_run["stdout"].splitlines()
    top = lines.index(machine_line(info))  # the table's first line
    assert lines[top + 1].startswith("convseq GPU check (DRY RUN")
    assert lines[top + 2].startswith("device: cpu | CUDA ")


def test_dry_run_training_figures(dry_run):
    result = dry_run["json"]
    assert result["ok"] is True
    env = result["env"]
    assert (env["dry_run"], env["device"], env["updates"]) == (True, "cpu", 4)
    assert env["torch"] == torch.__version__
    for label in TRAINED:
        train = result["train"][label]
        assert train["updates"] == 4 and train["skipped_updates"] == 0
        assert train["loss_scale"] is None  # no fp16 scaler outside 16-mixed
    train = result["train"]["fp32"]
    assert train["wps"] > 0 and math.isfinite(train["wps"])
    assert all(w > 0 for w in train["wps_epochs"])
    assert train["peak_mem_mib"] is None  # no allocator figure on the CPU
    # an untrained model's loss (base 2) sits near log2 of the target vocabulary
    assert 5.0 < train["first_loss"] < 12.0 and math.isfinite(train["last_loss"])
    assert "CPU" in result["train"]["16-mixed"]["skipped"]


def test_dry_run_parity_compares_the_three_figures_with_the_cpu(dry_run):
    parity = dry_run["json"]["parity"]
    ref = parity["reference"]
    assert math.isfinite(ref["gnorm_1"]) and ref["gnorm_1"] > 0
    for label in TRAINED:
        result = parity[label]
        assert result["updates"] == 8 and all(result["ok"].values())
        # the relative differences are those of the figures the runs logged
        assert result["rel"]["gnorm_1"] == pytest.approx(
            abs(result["gnorm_1"] - ref["gnorm_1"]) / ref["gnorm_1"]
        )
        assert result["rel"]["loss_n"] == pytest.approx(
            abs(result["loss_n"] - ref["loss_n"]) / ref["loss_n"]
        )
    if BF16:  # bf16 autocast rounds: not the fp32 run (a check comparing nothing would be)
        assert parity["bf16-mixed"]["rel"]["gnorm_1"] > 0
    else:
        assert "BF16" in parity["bf16-mixed"]["skipped"]
    assert "skipped" in parity["16-mixed"]


# one planted fault in the default run; the three others (each its own dry run) with -m slow
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "fault",
    [
        "uniform_logits",
        pytest.param("no_attention", marks=SLOW),
        pytest.param("sentence_norm", marks=SLOW),
        pytest.param("skip_step", marks=SLOW),
    ],
)
def test_each_planted_fault_fails_the_check(fault, tmp_path):
    """The bugs a loss-at-initialisation comparison let through: each must fail both the fp32
    and the bf16-mixed comparison, and the check exits 1."""
    out_json = tmp_path / "out.json"
    args = ["--dry-run", "--only", "parity", "--inject", fault, "--json", str(out_json)]
    proc = run_script(args, tmp_path / "cache", timeout=240)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out_json.read_text())
    assert result["parity"]["injected"]["fault"] == fault
    failed = {c["name"] for c in result["checks"] if not c["ok"]}
    assert failed == {"parity fp32 vs CPU", "parity bf16-mixed vs CPU"} & set(CHECKS)
    assert "SOME CHECKS FAILED" in proc.stdout


def test_dry_run_big_preset_through_the_trainer(dry_run):
    big = dry_run["json"]["big"]
    assert big["channel_divisor"] == 32 and big["updates"] == 3
    for label in TRAINED:
        f = big[label]
        # the trainer's own runs: its updates, summary and metrics.csv (padded token batches)
        assert f["updates"] == 3 and f["wps"] > 0 and math.isfinite(f["last_loss"])
        assert f["params_m"] > 0 and f["peak_mem_mib"] is None
    if BF16:
        assert big["fp32"]["params_m"] == big["bf16-mixed"]["params_m"]
    assert "CPU" in big["16-mixed"]["skipped"]


def test_dry_run_translation(dry_run):
    result = dry_run["json"]
    beam = result["beam"]
    assert beam["sentences"] == 8 and beam["identical"] == 8 and beam["ties"] == 0
    assert beam["share"] == 1.0 and beam["mismatches"] == [] and beam["mismatched"] == 0
    assert beam["beam1_sent_per_s"] > 0 and beam["beam5_sent_per_s"] > 0
    bf16 = result["beam_bf16"]
    if BF16:
        assert 0 <= bf16["equal_to_fp32"] <= 8 and bf16["beam5_sent_per_s"] > 0
    else:
        assert "BF16" in bf16["skipped"]
    assert result["test_device"] == "cpu"


def test_dry_run_lightconv_trains_and_translates_the_other_family(dry_run):
    light = dry_run["json"]["lightconv"]
    assert light["preset"] == "lightconv_iwslt_de_en"
    assert light["updates"] == 3 and light["width_divisor"] == 32
    for label in TRAINED:
        f = light[label]
        assert f["updates"] == 3 and f["wps"] > 0 and math.isfinite(f["last_loss"])
        assert 0 < f["params_m"] < 1 and f["peak_mem_mib"] is None  # the preset, narrowed
    assert "CPU" in light["16-mixed"]["skipped"]
    beam = light["beam"]
    assert beam["sentences"] == 8 and beam["identical"] == 8 and beam["mismatched"] == 0
    assert beam["beam5_sent_per_s"] > 0
    if BF16:
        assert 0 <= beam["bf16"]["equal_to_fp32"] <= 8
    else:
        assert "BF16" in beam["bf16"]["skipped"]
    out = dry_run["stdout"]
    assert "gpu_check: row | lightconv beam 5 cpu vs CPU | 8/8 identical" in out
    assert table_rows(out)["lightconv beam 5 cpu vs CPU"] == "PASS"


def test_dry_run_checks_and_budget_without_the_run_py_parts(dry_run):
    result = dry_run["json"]
    assert "resume" not in result and "ddp" not in result
    assert [c["name"] for c in result["checks"]] == [c for c in CHECKS if c not in RUNPY_ROWS]
    assert all(c["ok"] for c in result["checks"])
    budget = result["budget"]
    assert list(budget) == ["parity", "train", "translate", "lightconv", "big"]
    assert all(s > 0 for s in budget.values()) and sum(budget.values()) <= result["seconds"]
    assert "time by part:" in dry_run["stdout"]


# slow: the whole dry run; run.py's SIGTERM + resume and trainer=ddp paths are covered in the
# default run by tests/training/test_slurm_requeue.py and tests/training/test_ddp_resume.py
@pytest.mark.slow
def test_dry_run_resume_ddp_checks_and_budget(tmp_path):
    whole = _dry_run(tmp_path)
    result = whole["json"]
    rows = table_rows(whole["stdout"])
    assert set(rows) == set(ROWS)
    assert rows["SIGTERM, resume=true"] == "PASS" and rows["ddp, 2 processes"] == "PASS"
    assert "gpu_check: row | SIGTERM, resume=true | exit 75" in whole["stdout"]
    resume = result["resume"]
    assert resume["first_exit"] == 75 and resume["resumed_exit"] == 0
    assert resume["sigterm_after"] == 4 and 4 <= resume["stopped_at"] < 12
    assert resume["resumed_updates"] == 12 and resume["rel"] <= resume["tol"]
    assert resume["resumed_first_update"] == resume["stopped_at"] + 1  # continued, not restarted
    ddp = result["ddp"]
    assert (ddp["processes"], ddp["updates"], ddp["exit"]) == (2, 4, 0)
    assert ddp["ups"] > 0 and ddp["one_device_ups"] > 0
    assert [c["name"] for c in result["checks"]] == CHECKS
    assert all(c["ok"] for c in result["checks"])
    budget = result["budget"]
    assert list(budget) == ["parity", "train", "translate", "resume", "ddp", "lightconv", "big"]
    assert all(s > 0 for s in budget.values()) and sum(budget.values()) <= result["seconds"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_cuda_it_exits_2_and_names_dry_run(tmp_path):
    proc = run_script([], tmp_path / "cache", timeout=120)
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr and "--dry-run" in proc.stderr
    assert proc.stdout == ""


def _record(*hyps: tuple[str, float]) -> dict[str, Any]:
    return {"hypotheses": [{"text": t, "score": s} for t, s in hyps]}


def test_beam_agreement_forgives_near_ties_only():
    from gpu_parity import beam_agreement

    cpu = [
        _record(("a b", -0.50), ("a c", -0.90)),  # a clear best
        _record(("x y", -0.400), ("x z", -0.4004)),  # a near-tie (gap 4e-4)
        _record(("p q", -0.30), ("p r", -0.31)),  # gap 1e-2: not a tie
        _record(("m n", -0.20), ("m o", -0.2001)),  # a tie, but the device found a third
    ]
    result = beam_agreement(cpu, ["a b", "x z", "p r", "m k"], margin=1e-3)
    assert (result["identical"], result["ties"], result["mismatched"]) == (1, 1, 2)
    assert [m["line"] for m in result["mismatches"]] == [2, 3]
    assert result["mismatches"][0]["gap"] == pytest.approx(0.01)
    assert beam_agreement(cpu, ["a b", "x y", "p q", "m n"])["identical"] == 4
    with pytest.raises(ValueError):  # one device hypothesis per sentence
        beam_agreement(cpu, ["a b"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--resume-updates", "2"], "--resume-updates must be at least 3"),
        (["--big-updates", "0"], "--big-updates must be at least 1"),
        (["--only", "beam"], "invalid choice: 'beam'"),
    ],
)
def test_bad_sizes_are_refused_with_the_option_named(args, message, capsys):
    from gpu_check import parse_args

    with pytest.raises(SystemExit) as exit_info:
        parse_args(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
