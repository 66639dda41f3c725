"""task=generate gen.input=FILE: a raw text file translated as a split is (batches, files,
scores with gen.reference), without a data-bin; the errors name the file and line."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

import convseq.inference.jobs as jobs_mod
import convseq.tasks.generate as generate_mod
from convseq.data.databin import DataBin
from convseq.errors import DataError
from convseq.evaluation.scores import corpus_scores
from convseq.inference.translator import Translator
from convseq.tasks.generate import run_generate
from convseq.training.module import ConvSeqModule
from tests.fairseq_ckpt_factory import (
    fairseq_namespace,
    fconv_keys_and_shapes,
    fconv_state_dict,
    write_checkpoint,
    write_databin_files,
)
from tests.generation_utils import FAST_GEN, generate_config, subprocess_env, tiny_checkpoint
from tests.training_utils import launch_env

ROOT = Path(__file__).resolve().parents[2]
BEAM = "gen.beam=3"


@pytest.fixture
def tiny_ckpt(tiny_data, tmp_path_factory):
    return tiny_checkpoint(tiny_data, tmp_path_factory.getbasetemp())


@pytest.fixture
def no_databin(monkeypatch):
    """Make any attempt to build or read a data-bin fail: gen.input must not need one."""

    def refuse(*args, **kwargs):
        raise AssertionError("gen.input read a data-bin")

    monkeypatch.setattr(generate_mod, "open_databin", refuse)


def corpus_lines(tiny, name: str, n: int = 12) -> list[str]:
    return (tiny["corpus"] / name).read_text(encoding="utf-8").splitlines()[:n]


def with_blanks(lines: list[str], blanks: dict[int, str]) -> list[str]:
    """``lines`` with ``blanks[i]`` inserted so that it ends up at index i."""
    out = list(lines)
    for i in sorted(blanks):
        out.insert(i, blanks[i])
    return out


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


BLANKS = {5: "", 10: "   \t"}  # an empty and a whitespace-only line (lines 6 and 11)


def test_a_file_is_translated_as_translator_translate_does_in_input_order(
    tiny_data, tiny_ckpt, tmp_path, no_databin, caplog, one_thread
):
    sources = corpus_lines(tiny_data, "test.src")
    lengths = [len(s.split()) for s in sources]
    assert lengths != sorted(lengths)  # batches are length-sorted: the order has to be restored
    src = write_lines(tmp_path / "news.src.txt", with_blanks(sources, BLANKS))
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING):
        # 60 tokens: several batches of these 12 sentences
        result = run_generate(
            generate_config(
                tiny_data, out, f"ckpt={tiny_ckpt}", f"gen.input={src}", BEAM, "gen.max_tokens=60"
            )
        )

    translator = Translator.from_checkpoints(tiny_ckpt)
    records = translator.translate_records(sources, beam=3, max_len_b=12)
    expected = with_blanks([r["hypotheses"][0]["text"] for r in records], {i: "" for i in BLANKS})
    hyps = (out / "generate-news.src.txt").read_text(encoding="utf-8").split("\n")
    assert hyps == [*expected, ""]  # one line each, the empty lines' hypotheses empty

    # the tiny model's texts repeat; the sources and scores of each line tell them apart
    lines = (out / "generate-news.src.nbest.txt").read_text(encoding="utf-8").splitlines()
    tagged = {ln.split("\t", 1)[0]: ln.split("\t")[1:] for ln in lines}
    rows = [i for i in range(14) if i not in BLANKS]  # the output line of each record
    assert [k for k in tagged if k.startswith("S-")] == [f"S-{i}" for i in range(14)]
    assert [tagged[f"S-{i}"] for i in BLANKS] == [[""], [""]]
    assert not [k for k in tagged if k.startswith("T-")]  # no reference, no T- lines
    assert sorted((k for k in tagged if k.startswith("H-")), key=lambda k: int(k[2:])) == [
        f"H-{i}" for i in rows
    ]
    scores = [r["hypotheses"][0]["score"] / np.log(2) for r in records]
    assert len({round(x, 4) for x in scores}) == len(scores)  # distinct: a swap would show
    for row, record, score in zip(rows, records, scores):
        assert tagged[f"S-{row}"] == [" ".join(record["src_symbols"][:-1])]
        assert float(tagged[f"H-{row}"][0]) == pytest.approx(score, abs=1e-5)
        assert tagged[f"D-{row}"][1] == expected[row]

    saved = json.loads((out / "generate-news.src.json").read_text())
    assert saved["scores"] is None and result["scores"] is None
    assert saved["input"] == str(src) and saved["reference"] is None
    assert saved["sentences"] == 14 and saved["empty_lines"] == 2
    assert "2 empty line(s) (lines 6, 11)" in caplog.text and str(src) in caplog.text


def test_with_a_reference_the_scores_are_those_of_the_hypotheses(
    tiny_data, tiny_ckpt, tmp_path, no_databin, capsys, one_thread
):
    sources = corpus_lines(tiny_data, "test.src")
    refs = with_blanks(corpus_lines(tiny_data, "test.tgt"), {5: "a reference", 10: ""})
    src = write_lines(tmp_path / "in.txt", with_blanks(sources, BLANKS))
    ref = write_lines(tmp_path / "ref.txt", refs)
    out = tmp_path / "out"
    cfg = generate_config(
        tiny_data,
        out,
        f"ckpt={tiny_ckpt}",
        f"gen.input={src}",
        f"gen.reference={ref}",
        BEAM,
        "gen.plot_attention=6",
        "gen.profile=true",
    )
    result = run_generate(cfg)
    printed = capsys.readouterr().out
    # the first 6 translated lines, named by their line index: line 5 is empty, so 0-4 and 6
    assert sorted(p.name for p in out.glob("attention-in-*.png")) == [
        f"attention-in-{i}.png" for i in (0, 1, 2, 3, 4, 6)
    ]
    assert (out / "generate-in.profile.png").is_file() and "Where the time goes" in printed

    best = Translator.from_checkpoints(tiny_ckpt).translate(sources, beam=3, max_len_b=12)
    expected = with_blanks(best, {i: "" for i in BLANKS})
    assert (out / "generate-in.txt").read_text(encoding="utf-8").splitlines() == expected
    bleu = sacrebleu.corpus_bleu(expected, [refs])
    assert result["scores"]["bleu"] == pytest.approx(bleu.score)
    assert result["scores"] == corpus_scores(expected, refs).as_dict()
    assert json.loads((out / "generate-in.json").read_text())["scores"] == result["scores"]
    m = re.search(r"^BLEU\|nrefs:1\|.* = (\d+\.\d\d) ", printed, re.M)
    assert m and float(m.group(1)) == round(bleu.score, 2)
    assert re.search(r"^chrF2\|nrefs:1\|.* = \d+\.\d\d$", printed, re.M)
    assert re.search(r"^Translated 12 sentences \(\d+ tokens\)", printed, re.M)

    nbest = (out / "generate-in.nbest.txt").read_text(encoding="utf-8").splitlines()
    t_lines = [ln for ln in nbest if ln.startswith("T-")]
    assert t_lines == [f"T-{i}\t{r}" for i, r in enumerate(refs)]


# ---------------------------------------------------------------------------- errors


def _generate(tiny, ckpt, out, *overrides):
    return run_generate(generate_config(tiny, out, f"ckpt={ckpt}", *overrides))


def test_a_missing_input_or_a_folder_is_named(tiny_data, tiny_ckpt, tmp_path):
    missing = tmp_path / "nowhere.de"
    with pytest.raises(DataError, match=rf"^{re.escape(str(missing))}: gen.input: no such file"):
        _generate(tiny_data, tiny_ckpt, tmp_path, f"gen.input={missing}")
    with pytest.raises(DataError, match=rf"^{re.escape(str(tmp_path))}: gen.input names a folder"):
        _generate(tiny_data, tiny_ckpt, tmp_path, f"gen.input={tmp_path}")
    src = write_lines(tmp_path / "in.txt", ["a b"])
    with pytest.raises(DataError, match=rf"{re.escape(str(missing))}: gen.reference: no such"):
        _generate(tiny_data, tiny_ckpt, tmp_path, f"gen.input={src}", f"gen.reference={missing}")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=rf"^{re.escape(str(empty))}: gen.input is empty"):
        _generate(tiny_data, tiny_ckpt, tmp_path, f"gen.input={empty}")


def test_invalid_utf8_is_named_by_file_and_line(tiny_data, tiny_ckpt, tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"one line\ntwo lines\ncaf\xe9 au lait\n")
    with pytest.raises(DataError, match=rf"^{re.escape(str(bad))}:3: not valid UTF-8"):
        _generate(tiny_data, tiny_ckpt, tmp_path, f"gen.input={bad}")
    src = write_lines(tmp_path / "in.txt", ["a", "b", "c"])
    with pytest.raises(DataError, match=rf"^{re.escape(str(bad))}:3: not valid UTF-8"):
        _generate(tiny_data, tiny_ckpt, tmp_path, f"gen.input={src}", f"gen.reference={bad}")


def test_a_reference_of_another_length_names_both_files_and_counts(tiny_data, tiny_ckpt, tmp_path):
    src = write_lines(tmp_path / "in.txt", ["a", "b", "c"])
    ref = write_lines(tmp_path / "ref.txt", ["x", "y"])
    with pytest.raises(DataError) as e:
        _generate(tiny_data, tiny_ckpt, tmp_path, f"gen.input={src}", f"gen.reference={ref}")
    message = str(e.value)
    assert message.startswith(f"{ref}: gen.reference has 2 lines but gen.input {src} has 3")
    assert f"line 3 of {src} has no counterpart in {ref}" in message


def test_a_reference_without_an_input_is_refused(tiny_data, tiny_ckpt, tmp_path):
    ref = write_lines(tmp_path / "ref.txt", ["x"])
    with pytest.raises(DataError, match="gen.reference=.* is read only with gen.input=FILE"):
        _generate(tiny_data, tiny_ckpt, tmp_path, f"gen.reference={ref}")


def test_a_line_over_the_token_budget_is_named_by_file_and_line(tiny_data, tiny_ckpt, tmp_path):
    long = " ".join(corpus_lines(tiny_data, "test.src", 3))
    src = write_lines(tmp_path / "in.txt", ["a b", "", long, "c"])  # line 3, after an empty one
    with pytest.raises(DataError) as e:
        _generate(tiny_data, tiny_ckpt, tmp_path, f"gen.input={src}", "gen.max_tokens=8")
    message = str(e.value)
    assert message.startswith(f"{src}:3: this line is ")
    assert "gen.max_tokens=8" in message and "raise gen.max_tokens to at least" in message


def test_only_empty_lines_give_empty_hypotheses_without_translating(
    tiny_data, tiny_ckpt, tmp_path, capsys
):
    src = write_lines(tmp_path / "blank.txt", ["", "  "])
    result = _generate(tiny_data, tiny_ckpt, tmp_path / "out", f"gen.input={src}")
    assert (tmp_path / "out" / "generate-blank.txt").read_text() == "\n\n"
    assert result["sentences"] == 2 and result["tokens"] == 0
    assert "Translated 0 sentences" in capsys.readouterr().out


def test_output_name_is_the_stem_or_input():
    assert jobs_mod.output_name(Path("/data/newstest2014.de")) == "newstest2014"
    assert jobs_mod.output_name(Path("my file.de")) == "input"


# ---------------------------------------------------------------------------- fairseq, run.py


def test_a_fairseq_checkpoint_takes_its_pair_from_the_databin_file_names(
    tiny_data, tiny_ckpt, tmp_path, no_databin, one_thread
):
    """No languages in the checkpoint, and the dict sizes fit two pairs: the file names decide."""
    module = ConvSeqModule.load_from_checkpoint(str(tiny_ckpt))
    databin = DataBin(tiny_data["databin"])
    keys = fconv_keys_and_shapes(
        src_vocab=len(databin.src_dict),
        tgt_vocab=len(databin.tgt_dict),
        encoder_embed_dim=16,
        encoder_layers=[(16, 3)],
        decoder_embed_dim=16,
        decoder_layers=[(16, 3)],
        decoder_out_embed_dim=16,
        attention=[True],
    )
    values = {k: v.numpy() for k, v in module.model.state_dict().items() if k != "decoder.version"}
    model_args = {
        "arch": "fconv",
        "encoder_embed_dim": 16,
        "encoder_layers": "[(16, 3)]",
        "decoder_embed_dim": 16,
        "decoder_layers": "[(16, 3)]",
        "decoder_out_embed_dim": 16,
        "decoder_attention": "True",
        "share_input_output_embed": False,
    }
    args = fairseq_namespace(model_args, source_lang=None, target_lang=None)
    pt = write_checkpoint(
        tmp_path / "checkpoint_best.pt", fconv_state_dict(keys, values), args=args
    )
    dicts = tmp_path / "data-bin"
    dicts.mkdir()
    for lang in ("src", "tgt"):
        shutil.copy(databin.path / f"dict.{lang}.txt", dicts / f"dict.{lang}.txt")
    shutil.copy(databin.path / "dict.tgt.txt", dicts / "dict.xx.txt")  # a second target size
    sources = corpus_lines(tiny_data, "test.src", 8)
    src = write_lines(tmp_path / "in.txt", sources)
    overrides = [f"gen.input={src}", f"gen.dict_dir={dicts}", BEAM]
    with pytest.raises(Exception, match="does not name its language pair"):
        _generate(tiny_data, pt, tmp_path / "a", *overrides)

    write_databin_files(dicts, "src", "tgt")
    _generate(tiny_data, pt, tmp_path / "b", *overrides)
    expected = Translator.from_checkpoints(tiny_ckpt).translate(sources, beam=3, max_len_b=12)
    assert (tmp_path / "b" / "generate-in.txt").read_text().splitlines() == expected


def test_run_py_translates_a_file_with_a_reference_and_no_databin(tiny_data, tiny_ckpt, tmp_path):
    sources = corpus_lines(tiny_data, "test.src", 6)
    refs = corpus_lines(tiny_data, "test.tgt", 6)
    src = write_lines(tmp_path / "talks.src", sources)
    ref = write_lines(tmp_path / "talks.tgt", refs)
    out = tmp_path / "out"
    env = subprocess_env(tiny_data)
    env["CONVSEQ_CACHE"] = str(tmp_path / "cache")  # stays empty: no data-bin is built
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "task=generate",
            f"ckpt={tiny_ckpt}",
            f"gen.input={src}",
            f"gen.reference={ref}",
            f"gen.output={out}",
            *FAST_GEN,
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = Translator.from_checkpoints(tiny_ckpt).translate(sources, max_len_b=12)
    assert (out / "generate-talks.txt").read_text(encoding="utf-8").splitlines() == expected
    bleu = sacrebleu.corpus_bleu(expected, [refs]).score
    m = re.search(r"^BLEU\|nrefs:1\|.* = (\d+\.\d\d) ", proc.stdout, re.M)
    assert m and float(m.group(1)) == round(bleu, 2)
    assert not list((tmp_path / "cache").rglob("*"))


def test_two_ranks_write_exactly_the_files_of_one_process(
    tiny_data, tiny_ckpt, tmp_path, one_thread
):
    sources = corpus_lines(tiny_data, "test.src", 20)
    src = write_lines(tmp_path / "in.txt", with_blanks(sources, BLANKS))
    ref = write_lines(tmp_path / "ref.txt", corpus_lines(tiny_data, "test.tgt", 22))
    common = [f"gen.input={src}", f"gen.reference={ref}", "gen.max_tokens=60"]
    one = tmp_path / "one"
    run_generate(generate_config(tiny_data, one, f"ckpt={tiny_ckpt}", *common))
    env = launch_env(subprocess_env(tiny_data))
    two = tmp_path / "two"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "task=generate",
            f"ckpt={tiny_ckpt}",
            *FAST_GEN,
            *common,  # after FAST_GEN: its gen.max_tokens is overridden, as in generate_config
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.strategy=ddp",
            f"hydra.run.dir={two}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in ("generate-in.txt", "generate-in.nbest.txt"):
        assert (two / name).read_bytes() == (one / name).read_bytes(), name
    a = json.loads((one / "generate-in.json").read_text())
    b = json.loads((two / "generate-in.json").read_text())
    assert b["scores"] == a["scores"] and b["tokens"] == a["tokens"]
    shares = b["sentences_per_rank"]
    assert len(shares) == 2 and sum(shares) == 20 and min(shares) > 0  # both ranks translated
    assert proc.stdout.count("hypotheses written to") == 1  # rank 0 alone writes
