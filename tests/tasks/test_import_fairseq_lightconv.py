"""A fairseq LightConv checkpoint through the commands: task=import_fairseq converts it and
task=generate ckpt=X.pt translates with it, the same sentences either way."""

from __future__ import annotations

import pytest
import torch

from convseq.checkpoints.fairseq import load_fairseq, save_fairseq
from convseq.cli.dispatch import dispatch
from convseq.data.databin import DataBin
from convseq.models.lightconv import LightConvModel
from convseq.models.lightconv_config import LightConvConfig
from convseq.tasks.generate import run_generate
from tests.conftest import compose_config
from tests.generation_utils import generate_config

SMALL = dict(
    encoder_embed_dim=16,
    encoder_ffn_embed_dim=24,
    encoder_layers=2,
    encoder_attention_heads=2,
    encoder_kernel_size_list=(3, 5),
    decoder_layers=2,
    decoder_attention_heads=2,
    decoder_kernel_size_list=(3, 4),
    decoder_conv_type="lightweight",
)


@pytest.fixture
def fairseq_lightconv(tiny_data, tmp_path):
    """A fairseq LightConv file over the tiny corpus' dictionaries (written by save_fairseq)."""
    databin = DataBin(tiny_data["databin"])
    torch.manual_seed(5)
    src_dict, tgt_dict = databin.src_dict, databin.tgt_dict
    model = LightConvModel.build(LightConvConfig(**SMALL), len(src_dict), len(tgt_dict), 1)
    with torch.no_grad():  # away from the initial values, so the outputs depend on every weight
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return save_fairseq(model, tmp_path / "fairseq" / "model.pt", src_dict, tgt_dict, "src", "tgt")


def test_import_then_generate_equals_generate_from_the_fairseq_file(
    fairseq_lightconv, tiny_data, tmp_path, cache_dir, one_thread
):
    from convseq.training.module import ConvSeqModule

    out = tmp_path / "imported.ckpt"
    cfg = compose_config(
        ["task=import_fairseq", f"ckpt={fairseq_lightconv}", f"import_fairseq.output={out}"],
        output_dir=str(tmp_path),
    )
    assert dispatch(cfg) == out
    module = ConvSeqModule.load_from_checkpoint(str(out), map_location="cpu", weights_only=True)
    assert module.hparams["model"]["family"] == "lightconv"
    reference, _, _ = load_fairseq(fairseq_lightconv)
    src = torch.tensor([[1, 5, 6, 2], [7, 8, 9, 2]])
    prev = torch.tensor([[2, 4, 5], [2, 6, 7]])
    with torch.no_grad():
        a = module.model.eval()(src, torch.tensor([3, 4]), prev)[0]
        b = reference(src, torch.tensor([3, 4]), prev)[0]
    assert torch.equal(a, b)

    theirs = run_generate(
        generate_config(tiny_data, tmp_path / "a", f"ckpt={fairseq_lightconv}", "data=toy")
    )
    ours = run_generate(generate_config(tiny_data, tmp_path / "b", f"ckpt={out}", "data=toy"))
    assert theirs["sentences"] == ours["sentences"] == 40
    assert (tmp_path / "a" / "generate-test.txt").read_text() == (
        tmp_path / "b" / "generate-test.txt"
    ).read_text()
