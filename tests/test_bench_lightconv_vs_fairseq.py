"""bench/bench_lightconv_vs_fairseq.py's own side, without fairseq: its dry run (in process)
writes each setting's model with save_fairseq, reads it back strictly and finds the same
log-probabilities and beam hypotheses; the fairseq command line and batch it builds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_lightconv_vs_fairseq as blv  # noqa: E402
from machine import machine_line  # noqa: E402


def test_dry_run_round_trips_every_setting(tmp_path, monkeypatch, capsys):
    out = tmp_path / "result.json"
    monkeypatch.setattr(blv, "WORK", tmp_path / "work")
    argv = ["bench_lightconv_vs_fairseq.py", "--dry-run", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", [*argv, "--threads", "1"])
    blv.main()
    assert capsys.readouterr().out.splitlines()[0] == machine_line()
    result = json.loads(out.read_text())
    assert [r["setting"] for r in result["log_probs"]] == list(blv.SETTINGS)
    assert all(r["diff"] == 0.0 for r in result["log_probs"])
    beam = result["beam"]
    assert beam["sentences"] == 4 and beam["identical"] == 4 and beam["beam"] == 5
    assert (tmp_path / "work" / "beam" / "dict.src.txt").is_file()


def test_without_ckpt_or_dry_run_the_command_says_what_it_needs(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_lightconv_vs_fairseq.py"])
    with pytest.raises(SystemExit):
        blv.main()
    assert "--ckpt" in capsys.readouterr().err


def test_fairseq_command_line_gives_every_setting_as_fairseqs_options():
    argv = blv.fairseq_argv(blv.SETTINGS["lightweight"])
    pairs = dict(zip(argv[::2], argv[1::2], strict=True))
    assert pairs["--arch"] == "lightconv" and pairs["--dropout"] == "0.0"
    assert pairs["--encoder-kernel-size-list"] == "[3,7,15]"
    assert pairs["--decoder-conv-type"] == "lightweight"
    assert pairs["--encoder-embed-dim"] == "32" and pairs["--max-target-positions"] == "64"


def test_the_batch_is_padded_as_fairseqs_translation_task():
    data = blv.batch(1)
    src, prev = data["src_tokens"], data["prev_output_tokens"]
    assert src[:, -1].eq(blv.EOS).all()  # left-padded sources end in EOS
    assert (src != blv.PAD).sum(1).tolist() == data["src_lengths"].tolist()
    assert prev[:, 0].eq(blv.EOS).all() and prev[4, 3:].eq(blv.PAD).all()  # right-padded
