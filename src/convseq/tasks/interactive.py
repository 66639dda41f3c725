"""`task=interactive`: translate lines from stdin as they arrive.

    python run.py task=interactive ckpt=outputs/.../checkpoints/best.ckpt [gen.beam=5]

Each input line gets exactly one output line on stdout, flushed at once: its translation (with
``gen.nbest > 1``, the hypotheses joined by `` ||| ``), or an empty line when there was nothing
to translate. Messages go to stderr: an empty line, a line that is not valid UTF-8, and a line
longer than the model's source positions (translated truncated) are reported there, and the loop
goes on. Input goes through the segmentation the model was trained with (stored in convseq's
checkpoints; whitespace tokens for fairseq checkpoints). No data is needed; data given
(``data=...``) must be the checkpoint's (`convseq.inference.data_match.check_given_data`).
"""

from __future__ import annotations

import logging
import sys
from typing import IO

import torch

from convseq.common.parallel_jobs import task_threads
from convseq.errors import ConvseqError
from convseq.inference.data_match import check_given_data, split_given
from convseq.inference.generation import checkpoint_paths, load_translator
from convseq.inference.loading import folder_choice
from convseq.inference.translator import Translator
from convseq.tasks.config import GenerateTaskConfig

SEPARATOR = " ||| "


def answer(translator: Translator, text: str, lineno: int, err: IO[str]) -> str:
    """The output line for one decoded input line (messages for the user go to ``err``)."""
    line = text.rstrip("\r\n")
    if not line.strip():
        print(f"convseq: line {lineno}: empty, nothing to translate", file=err, flush=True)
        return ""
    encoded, _ = translator.encode_lines(
        [line],
        lambda _: f"line {lineno}",
        lambda msg: print(f"convseq: {msg}", file=err, flush=True),
    )
    try:
        records = translator.translate_encoded(encoded, max_tokens=None, batch_size=1)
    except ConvseqError as e:  # e.g. out of memory on a very long line
        print(f"convseq: line {lineno}: {e}", file=err, flush=True)
        return ""
    return SEPARATOR.join(h["text"] for h in records[0]["hypotheses"])


def serve(
    translator: Translator, stdin: IO[bytes], stdout: IO[str], stderr: IO[str]
) -> tuple[int, int]:
    """Answer every line of ``stdin`` until it ends; returns (lines read, lines translated)."""
    read = translated = 0
    while True:
        raw = stdin.readline()
        if not raw:
            break
        read += 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            print(
                f"convseq: line {read}: not valid UTF-8 (byte {e.start}: {raw[e.start : e.start + 1]!r}); "
                "skipped",
                file=stderr,
                flush=True,
            )
            out = ""
        else:
            out = answer(translator, text, read, stderr)
        translated += bool(out)
        stdout.write(out + "\n")
        stdout.flush()
    return read, translated


def _keep_stdout_for_answers(stdout: IO[str]) -> None:
    """Send log records (Hydra logs to stdout by default) to stderr: stdout is for answers."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (stdout, sys.stdout):
            handler.setStream(sys.stderr)


def run_interactive(
    cfg: GenerateTaskConfig,
    stdin: IO[bytes] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> tuple[int, int]:
    """`python run.py task=interactive ckpt=...`: see the module docstring."""
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout
    stderr = stderr if stderr is not None else sys.stderr
    task_threads(cfg.trainer)  # this process's share of the CPUs
    _keep_stdout_for_answers(stdout)
    accelerator = cfg.trainer.accelerator
    ckpts = checkpoint_paths(cfg.ckpt, task=cfg.task)  # none: "task=interactive needs ckpt"
    translator = load_translator(ckpts, cfg.gen, accelerator, databin=None)
    given, _ = split_given(cfg.data)
    if given is not None:  # a data option: it must be the data the model was trained on
        check_given_data(translator.trained_on, given)
    if accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        translator.to("cuda")
    opts = translator.options
    seg = "sentencepiece" if translator.src_segmenter.model is not None else "whitespace tokens"
    for path in ckpts:  # a run folder: which of its files, and why
        if (chosen := folder_choice(path)) is not None:
            print(f"convseq: {chosen}", file=stderr, flush=True)
    print(
        f"convseq: translating stdin with {', '.join(ckpts)} "
        f"(beam {opts.beam}, lenpen {opts.lenpen}, {seg}); one line in, one line out",
        file=stderr,
        flush=True,
    )
    with torch.inference_mode():
        return serve(translator, stdin, stdout, stderr)
