"""`ckpt=<run folder>` says which checkpoint file of the folder it reads, and why: task=generate
on stdout, task=interactive on stderr (`convseq.inference.loading.folder_choice`).

The folder is a run interrupted by SIGTERM in its second epoch: best.ckpt from the end of epoch
1, and a mid-epoch last.ckpt; a copy without best.ckpt stands for a run interrupted before its
first validation (generate then reads the mid-epoch last.ckpt).
"""

from __future__ import annotations

import io
import shutil
import signal

import pytest
import torch

from convseq.tasks.generate import run_generate
from convseq.tasks.interactive import run_interactive
from convseq.tasks.train import train
from tests.generation_utils import generate_config
from tests.training.test_resume import SendSignal
from tests.training_utils import last_checkpoint, summary, tiny_config


@pytest.fixture(scope="module")
def cut(tiny_data, tmp_path_factory):
    """A 3-epoch tiny run stopped by SIGTERM at update 25 (epoch 2 has updates 19-36)."""
    run = tmp_path_factory.mktemp("cut") / "run"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = tiny_config(tiny_data, run, "trainer.max_epochs=3", "gen.test_bleu=false")
        train(cfg, callbacks=[SendSignal(signal.SIGTERM, 25)])
    finally:
        torch.set_num_threads(before)
    assert summary(run)["signal"] == "SIGTERM"
    return run


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "ckpt=" in line and ": using " in line]


def test_generate_on_a_run_folder_names_best_ckpt_and_the_later_last_ckpt(
    tiny_data, cut, tmp_path, capsys, one_thread
):
    s = summary(cut)
    best_updates = s["history"][0]["updates"]  # best.ckpt: the end of epoch 1, its only validation
    last_updates = last_checkpoint(cut)["global_step"]
    assert best_updates == 18 and best_updates < last_updates < 36
    run_generate(generate_config(tiny_data, tmp_path, f"ckpt={cut}"))
    last = cut / "checkpoints" / "last.ckpt"
    assert _lines(capsys.readouterr().out) == [
        f"convseq: ckpt={cut}: using checkpoints/best.ckpt, the best valid/loss "
        f"({s['best_value']:.4f}) of the run's validations, saved at update {best_updates}, at "
        f"the end of epoch 1; checkpoints/last.ckpt is later (update {last_updates}, in the "
        f"middle of epoch 2): ckpt={last} uses it"
    ]


def test_generate_on_a_folder_without_best_ckpt_names_the_mid_epoch_last_ckpt(
    tiny_data, cut, tmp_path, capsys, one_thread
):
    folder = tmp_path / "interrupted"
    shutil.copytree(cut / "checkpoints", folder / "checkpoints")
    (folder / "checkpoints" / "best.ckpt").unlink()
    updates = last_checkpoint(folder)["global_step"]
    run_generate(generate_config(tiny_data, tmp_path / "by_folder", f"ckpt={folder}"))
    assert _lines(capsys.readouterr().out) == [
        f"convseq: ckpt={folder}: using checkpoints/last.ckpt, saved at update {updates}, in the "
        "middle of epoch 2, where the run was interrupted; no best.ckpt: the run had not "
        "validated yet"
    ]
    # the file named is the file read; a file given names itself, no line
    last = folder / "checkpoints" / "last.ckpt"
    run_generate(generate_config(tiny_data, tmp_path / "by_file", f"ckpt={last}"))
    assert _lines(capsys.readouterr().out) == []
    by_folder = (tmp_path / "by_folder" / "generate-test.nbest.txt").read_text()
    assert by_folder == (tmp_path / "by_file" / "generate-test.nbest.txt").read_text()
    best = generate_config(tiny_data, tmp_path / "by_best", f"ckpt={cut}/checkpoints/best.ckpt")
    run_generate(best)
    assert by_folder != (tmp_path / "by_best" / "generate-test.nbest.txt").read_text()


def test_interactive_names_the_file_on_stderr(tiny_data, cut, tmp_path, one_thread):
    cfg = generate_config(tiny_data, tmp_path, "task=interactive", f"ckpt={cut}/checkpoints")
    out, err = io.StringIO(), io.StringIO()
    run_interactive(cfg, io.BytesIO(b"a b c\n"), out, err)
    assert len(out.getvalue().splitlines()) == 1  # stdout holds the answers only
    lines = _lines(err.getvalue())
    assert len(lines) == 1
    assert lines[0].startswith(f"convseq: ckpt={cut}/checkpoints: using best.ckpt, the best ")
    assert "last.ckpt is later" in lines[0]
