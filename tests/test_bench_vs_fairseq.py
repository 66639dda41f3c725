"""bench/bench_vs_fairseq.py's own parts, without fairseq: the text it hands fairseq-preprocess
reads back into the data-bin's ids, its reading of fairseq-train's per-update log, and the
generation report's machine line and JSON (both sides stubbed)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from convseq.data.databin import DataBin

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_vs_fairseq as bvf  # noqa: E402
import bench_vs_fairseq_gen as bvg  # noqa: E402
from machine import machine, machine_line  # noqa: E402


def test_fairseq_text_reads_back_into_the_same_ids(tiny_data, tmp_path):
    db = DataBin(tiny_data["databin"])
    out = bvf.write_fairseq_text(db, tmp_path / "text")
    for side in ("src", "tgt"):
        lang, d = db.lang(side), db.dictionary(side)
        assert (out / f"dict.{lang}.txt").read_bytes() == (
            db.path / f"dict.{lang}.txt"
        ).read_bytes()
        for split in ("train", "valid"):
            arr = db.split(split)[0 if side == "src" else 1]
            lines = (out / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            assert len(lines) == len(arr)
            for i in (0, len(arr) // 2, len(arr) - 1):
                # fairseq-preprocess splits on whitespace, looks each symbol up, appends EOS
                ids = np.array([d.index(t) for t in lines[i].split()] + [d.eos_index])
                assert np.array_equal(ids, np.asarray(arr[i]))


def fairseq_line(update: int, loss: float, wpb: float, wps: float) -> str:
    record = {"epoch": 1, "update": update, "loss": loss, "wpb": wpb, "wps": wps, "bsz": 200}
    return f"2026-12-04 | INFO | train_inner | {json.dumps(record)}"


def test_fairseq_log_gives_tokens_seconds_and_the_first_loss():
    lines = [
        "2026-12-04 | INFO | fairseq_cli.train | task: TranslationTask",
        fairseq_line(1, 12.1, 3000, 1000),  # warmup: 3 s, left out
        fairseq_line(2, 11.9, 3300, 3300),  # 1 s
        '2026-12-04 | INFO | train | {"epoch": 1, "loss": 11.0}',  # not an update
        fairseq_line(3, 11.5, 3600, 1800),  # 2 s
    ]
    got = bvf.parse_fairseq_log(lines, warmup=1)
    assert got["updates"] == 2
    assert got["tokens"] == pytest.approx(6900)
    assert got["seconds"] == pytest.approx(3.0)
    assert got["first_loss"] == pytest.approx(12.1)
    with pytest.raises(SystemExit, match="fewer than the warmup"):
        bvf.parse_fairseq_log(lines, warmup=3)


def side_result(seconds: float) -> dict:
    """A side's result as its child prints it: two sentences, their best hypotheses."""
    return {"seconds": seconds, "cpu_seconds": seconds, "sentences": 2, "tokens": 5,
            "hyps": [[4, 5, 2], [6, 2]]}  # fmt: skip


def test_generation_report_and_json_name_the_machine(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bvg, "WORK", tmp_path)
    monkeypatch.setattr(bvg, "prepare", lambda args: tmp_path / "export" / "checkpoint.pt")
    monkeypatch.setattr(bvg, "in_child", lambda side, args, extra: side_result(1.0))
    monkeypatch.setattr(bvg, "fairseq_side", lambda export, beam, batch, n: side_result(2.0))
    args = argparse.Namespace(threads=torch.get_num_threads(), dry_run=False, beams=[5],
                              batches=[64], repeats=2, precision="fp32")  # fmt: skip
    bvg.generate_main(args, [])
    data = json.loads((tmp_path / "generate-fp32-b5_n64.json").read_text())
    assert data["machine"]["model"] == machine()["model"]
    assert capsys.readouterr().out.splitlines()[0] == machine_line(data["machine"])
    # the figures stay where they were, beside the machine
    assert set(data) == {"machine", "beam5_batch64"}
    assert data["beam5_batch64"]["ratio_of_medians"] == pytest.approx(2.0)
    assert data["beam5_batch64"]["identical_best"] == "2/2"


def test_generate_dry_run_prints_the_machine_line_first():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_vs_fairseq.py"), "generate", "--dry-run",
         "--ckpt", "model.ckpt", "--threads", str(torch.get_num_threads())],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, export = proc.stdout.splitlines()
    assert first == machine_line()
    assert export.startswith("export model.ckpt -> ")
