"""task=average: the averaged parameters equal the mean by hand; last_n picks the last epochs."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from convseq.checkpoints.average import AVERAGE_KEY, average_checkpoints, last_n_checkpoints
from convseq.cli.dispatch import dispatch
from convseq.errors import CheckpointError
from convseq.tasks.train import train
from convseq.training.module import ConvSeqModule
from tests.conftest import compose_config
from tests.training_utils import TINY_MODEL, tiny_config, tiny_databin


def _module(tiny_data, seed: int, tgt_vocab: list[str] | None = None) -> ConvSeqModule:
    databin = tiny_databin(tiny_data)
    model = compose_config(TINY_MODEL, output_dir="unused").model
    torch.manual_seed(seed)
    module = ConvSeqModule(
        model=model,
        src_vocab=databin.src_dict.to_list(),
        tgt_vocab=tgt_vocab or databin.tgt_dict.to_list(),
        optim={"name": "nag", "lr": 0.25},
    )
    with torch.no_grad():  # biases start at zero in every model: make every tensor differ
        for p in module.parameters():
            p.add_(torch.randn_like(p))
    return module


def _save(module: ConvSeqModule, path: Path, epoch: int) -> dict[str, torch.Tensor]:
    """A checkpoint as Lightning writes one (the parts load_from_checkpoint reads)."""
    state = {k: v.clone() for k, v in module.state_dict().items()}
    torch.save(
        {
            "state_dict": state,
            "hyper_parameters": dict(module.hparams),
            "pytorch-lightning_version": pl.__version__,
            "epoch": epoch,
            "global_step": 10 * epoch,
            "optimizer_states": [{"state": {}, "param_groups": []}],
        },
        path,
    )
    return state


def test_average_of_three_checkpoints_is_the_mean_by_hand(tiny_data, tmp_path):
    paths, states = [], []
    for seed in (1, 2, 3):
        path = tmp_path / f"m{seed}.ckpt"
        states.append(_save(_module(tiny_data, seed), path, epoch=seed))
        paths.append(path)
    out = average_checkpoints(paths, tmp_path / "avg" / "averaged.ckpt")

    loaded = ConvSeqModule.load_from_checkpoint(str(out), map_location="cpu", weights_only=True)
    averaged = loaded.state_dict()
    assert list(averaged) == list(states[0])
    assert len(averaged) > 10
    for name, value in averaged.items():
        by_hand = (
            states[0][name].double() + states[1][name].double() + states[2][name].double()
        ) / 3
        assert value.dtype == states[0][name].dtype
        # Summed in float64, rounded once to float32: exactly the rounded mean.
        assert torch.equal(value, by_hand.to(value.dtype)), name
        if value.is_floating_point() and value.numel() > 1:
            assert not torch.equal(value, states[0][name])  # really averaged, not copied
    assert loaded.hparams["tgt_vocab"] == tiny_databin(tiny_data).tgt_dict.to_list()
    raw = torch.load(out, weights_only=True)
    assert "optimizer_states" not in raw  # not a point to resume from
    assert raw[AVERAGE_KEY]["checkpoints"] == [str(p) for p in paths]
    assert list(out.parent.iterdir()) == [out]  # written atomically: no temporary file left


def test_refuses_other_models_duplicates_and_overwriting_an_input(tiny_data, tmp_path):
    a, b, c = tmp_path / "a.ckpt", tmp_path / "b.ckpt", tmp_path / "c.ckpt"
    _save(_module(tiny_data, 1), a, 1)
    _save(_module(tiny_data, 2), b, 2)
    vocab = tiny_databin(tiny_data).tgt_dict.to_list()
    _save(_module(tiny_data, 3, tgt_vocab=[*vocab, "extra"]), c, 3)
    with pytest.raises(
        CheckpointError, match=r"c\.ckpt: its tgt_vocab differs from that of .*a\.ckpt"
    ):
        average_checkpoints([a, c], tmp_path / "x.ckpt")
    with pytest.raises(CheckpointError, match="listed twice"):
        average_checkpoints([a, b, a], tmp_path / "x.ckpt")
    with pytest.raises(CheckpointError, match="would overwrite one of the inputs"):
        average_checkpoints([a, b], b)
    with pytest.raises(CheckpointError, match="no such checkpoint file"):
        average_checkpoints([a, tmp_path / "missing.ckpt"], tmp_path / "x.ckpt")
    torch.save({"model": {}}, tmp_path / "fairseq.pt")
    with pytest.raises(CheckpointError, match="not a convseq training checkpoint"):
        average_checkpoints([a, tmp_path / "fairseq.pt"], tmp_path / "x.ckpt")
    assert not (tmp_path / "x.ckpt").exists()


def test_last_n_takes_the_highest_epochs_and_needs_enough(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    for name in ("epoch002.ckpt", "epoch010.ckpt", "epoch009.ckpt", "last.ckpt", "best.ckpt"):
        (folder / name).write_bytes(b"")
    assert [p.name for p in last_n_checkpoints(tmp_path / "run", 2)] == [
        "epoch010.ckpt",
        "epoch009.ckpt",
    ]
    assert len(last_n_checkpoints(folder, 3)) == 3
    with pytest.raises(CheckpointError, match="checkpoint.keep_epochs=4"):
        last_n_checkpoints(folder, 4)


def test_task_average_last_n_of_a_trained_run(tiny_data, one_thread, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(tiny_data, run, "trainer.max_epochs=3", "checkpoint.keep_epochs=-1"))
    ckpts = run / "checkpoints"
    states = {
        e: torch.load(ckpts / f"epoch00{e}.ckpt", weights_only=True)["state_dict"] for e in (2, 3)
    }
    here = tmp_path / "average_run"
    cfg = compose_config(
        ["task=average", f"ckpts=[{run}]", "average.last_n=2"], output_dir=str(here)
    )
    out = dispatch(cfg)
    assert out == here / "averaged.ckpt"
    avg = torch.load(out, weights_only=True)
    assert avg[AVERAGE_KEY]["checkpoints"] == [
        str(ckpts / "epoch003.ckpt"),
        str(ckpts / "epoch002.ckpt"),
    ]
    for name, value in avg["state_dict"].items():
        by_hand = (states[2][name].double() + states[3][name].double()) / 2
        assert torch.equal(value, by_hand.to(value.dtype)), name

    # Listing files works too, and a folder without last_n is refused with the way out.
    cfg = compose_config(
        [
            "task=average",
            f"ckpts=[{ckpts / 'epoch001.ckpt'},{ckpts / 'epoch003.ckpt'}]",
            f"average.output={tmp_path / 'two.ckpt'}",
        ],
        output_dir=str(here),
    )
    assert dispatch(cfg) == tmp_path / "two.ckpt"
    cfg = compose_config(["task=average", f"ckpts=[{run}]"], output_dir=str(here))
    with pytest.raises(SystemExit) as e:
        dispatch(cfg)
    assert e.value.code == 2
