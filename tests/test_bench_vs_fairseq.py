"""bench/bench_vs_fairseq.py's own parts, without fairseq: the text it hands fairseq-preprocess
reads back into the data-bin's ids, and its reading of fairseq-train's per-update log."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from convseq.data.databin import DataBin

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_vs_fairseq as bvf  # noqa: E402


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
