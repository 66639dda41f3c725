"""task=import_fairseq: a fairseq fconv checkpoint becomes a convseq checkpoint with equal outputs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from convseq.checkpoints.fairseq import load_fairseq
from convseq.cli.dispatch import dispatch
from tests.conftest import compose_config
from tests.fairseq_ckpt_factory import (
    fairseq_namespace,
    fconv_keys_and_shapes,
    fconv_state_dict,
    write_checkpoint,
    write_dict,
)

SMALL = dict(
    src_vocab=16,
    tgt_vocab=24,
    encoder_embed_dim=8,
    encoder_layers=[(8, 3)] * 2,
    decoder_embed_dim=8,
    decoder_layers=[(8, 3)] * 2,
    decoder_out_embed_dim=8,
    attention=[True, True],
)
SMALL_ARGS = dict(
    arch="fconv",
    encoder_embed_dim=8,
    encoder_layers="[(8, 3)] * 2",
    decoder_embed_dim=8,
    decoder_layers="[(8, 3)] * 2",
    decoder_out_embed_dim=8,
    decoder_attention="True",
    share_input_output_embed=False,
    dropout=0.2,
)


@pytest.fixture
def fairseq_checkpoint(tmp_path):
    folder = tmp_path / "fairseq"
    folder.mkdir()
    sd = fconv_state_dict(fconv_keys_and_shapes(**SMALL), seed=3)
    path = write_checkpoint(folder / "checkpoint_best.pt", sd, args=fairseq_namespace(SMALL_ARGS))
    write_dict(folder / "dict.de.txt", 16, prefix="s")
    write_dict(folder / "dict.en.txt", 24, prefix="t")
    return path


def _logits(model):
    src = torch.tensor([[5, 6, 7, 2], [1, 1, 9, 2]])
    prev = torch.tensor([[2, 4, 5], [2, 6, 1]])
    with torch.no_grad():
        logits, _ = model(src, torch.tensor([4, 2]), prev)
    return logits


def test_import_fairseq_task_writes_a_loadable_checkpoint(fairseq_checkpoint, tmp_path, cache_dir):
    from convseq.training.module import ConvSeqModule

    out = tmp_path / "out" / "imported.ckpt"
    cfg = compose_config(
        ["task=import_fairseq", f"ckpt={fairseq_checkpoint}", f"import_fairseq.output={out}"],
        output_dir=str(tmp_path),
    )
    assert dispatch(cfg) == out and out.is_file()
    module = ConvSeqModule.load_from_checkpoint(str(out), map_location="cpu", weights_only=True)
    module.eval()
    reference, src_dict, tgt_dict = load_fairseq(fairseq_checkpoint)
    assert module.src_dict.symbols == src_dict.symbols
    assert module.tgt_dict.symbols == tgt_dict.symbols
    assert module.hparams["model"]["dropout"] == pytest.approx(0.2)
    assert torch.equal(_logits(module.model), _logits(reference.eval()))


def test_import_fairseq_checkpoint_loads_in_a_fresh_process(fairseq_checkpoint, tmp_path):
    from convseq.tasks.import_fairseq import import_fairseq

    out = import_fairseq(fairseq_checkpoint, tmp_path / "imported.ckpt")
    code = (
        "import torch; from convseq import ConvSeqModule\n"
        f"m = ConvSeqModule.load_from_checkpoint({str(out)!r}, map_location='cpu')\n"
        "print(len(m.src_dict), len(m.tgt_dict))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["16", "24"]


def test_import_fairseq_without_ckpt_is_a_clear_error(tmp_path, cache_dir, capsys):
    cfg = compose_config(["task=import_fairseq"], output_dir=str(tmp_path))
    with pytest.raises(SystemExit) as e:
        dispatch(cfg)
    assert e.value.code == 2
    assert "needs ckpt=PATH" in capsys.readouterr().err
