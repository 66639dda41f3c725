"""task=interactive: a run.py subprocess answers every stdin line as soon as it is written."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from convseq.inference.translator import Translator
from tests.generation_utils import FAST_GEN, subprocess_env, tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120  # seconds to wait for one answer (the first includes start-up on a busy machine)


@pytest.fixture
def tiny_ckpt(tiny_data, tmp_path_factory):
    return tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())


def _reader(stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, b""):
        lines.put(line.decode("utf-8"))
    lines.put(None)


def test_interactive_answers_each_line_including_empty_overlong_and_bad_bytes(
    tiny_data, tiny_ckpt, tmp_path
):
    sources = (tiny_data["corpus"] / "test.src").read_text(encoding="utf-8").splitlines()
    overlong = " ".join(sources[0].split() * 100)  # ~1400 words: over the 1022 positions
    translator = Translator.from_checkpoints(tiny_ckpt)
    expected = translator.translate([sources[0], sources[1], overlong], max_len_b=12)
    assert len(translator.encode(overlong)[0]) == 1022 and translator.encode(overlong)[1]

    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "task=interactive",
            f"ckpt={tiny_ckpt}",
            *FAST_GEN,
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env=subprocess_env(tiny_data),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out: queue.Queue = queue.Queue()
    err: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, out), daemon=True).start()
    threading.Thread(target=_reader, args=(proc.stderr, err), daemon=True).start()

    def ask(raw: bytes) -> str:
        proc.stdin.write(raw + b"\n")
        proc.stdin.flush()
        try:
            answer = out.get(timeout=TIMEOUT)
        except queue.Empty:
            proc.kill()
            pytest.fail(f"no answer to {raw[:40]!r} within {TIMEOUT}s")
        assert answer is not None, "the process ended before answering"
        return answer.rstrip("\n")

    try:
        assert ask(sources[0].encode()) == expected[0]
        assert ask(b"") == ""  # empty: a message, an empty answer, and the loop goes on
        assert ask(b"   \t ") == ""
        assert ask(overlong.encode()) == expected[2]  # truncated, then translated
        assert ask(b"caf\xc3 \xff\xfe broken") == ""  # not UTF-8
        assert ask(sources[1].encode()) == expected[1]  # still serving
        proc.stdin.close()
        assert proc.wait(timeout=TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    messages = []
    while (line := err.get(timeout=TIMEOUT)) is not None:
        messages.append(line)
    text = "".join(messages)
    assert "line 2: empty, nothing to translate" in text
    assert "line 3: empty, nothing to translate" in text
    assert "line 4: longer than the model's 1022 source positions" in text
    assert "line 5: not valid UTF-8 (byte 3" in text
    assert "line 6:" not in text and "line 1:" not in text
