"""DDP on CPU: 2 processes (gloo) train one epoch, run as tests/ddp_script.py in a subprocess.

Lightning's DDP launcher starts the second rank by re-running the command line, so the DDP run
cannot happen inside pytest; the script records what each rank did and this test checks it:

- after one update, both ranks hold the weights of a single process that saw the union of both
  ranks' first batches (fairseq's normalisation by the global token count), to 1e-5;
- every real training sentence is seen exactly once per epoch; the rank that comes up one batch
  short runs a dummy batch instead, so both ranks take the same number of steps;
- validation and test figures equal a single-process evaluation of the whole split (the dummy
  batch evening out the ranks is not counted);
- only rank 0 writes checkpoints, logs and the summary, and prints the summary line;
- a model with parameters that get no gradient (`model.decoder_attention=false`: the encoder's
  output goes unused) trains past the second step, where PyTorch's DDP, not told, fails.

The two runs share one launch (tests/ddp_script.py's ``--then``): the unused-parameter run starts
in the same two processes once the first has ended.
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest
import torch

from convseq.data.databin import DataBin
from convseq.data.dataset import LanguagePairDataset
from convseq.optim.build import build_optimizer
from convseq.training.module import ConvSeqModule
from tests.training_utils import ddp_script_command, launch_env

# the second run of the launch: no decoder layer attends, so no encoder parameter gets a gradient
UNUSED = ["model.decoder_attention=false", "trainer.limit_train_batches=4", "final_test=false"]


@pytest.fixture(scope="module")
def launch(tiny_data, tmp_path_factory):
    """Run the script once, with its two runs; the working folder and the process."""
    work = tmp_path_factory.mktemp("ddp")
    env = launch_env()
    cmd = ddp_script_command(tiny_data, work / "out", work / "record")
    cmd += ["--then", str(work / "unused" / "out"), str(work / "unused" / "record"), *UNUSED]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return work, proc


@pytest.fixture(scope="module")
def ddp_run(launch):
    """The first run: the records of both ranks, the output folder and stdout."""
    work, proc = launch
    out, record = work / "out", work / "record"
    ranks = [torch.load(record / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    writes = [json.loads((record / f"rank{r}_writes.json").read_text()) for r in (0, 1)]
    return {"ranks": ranks, "writes": writes, "out": out, "stdout": proc.stdout}


def _module(out) -> tuple[ConvSeqModule, dict]:
    """A fresh module built from the run's own hyperparameters (read from last.ckpt)."""
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    return ConvSeqModule(**ckpt["hyper_parameters"]), ckpt


def _step_from(init: dict, batches: list[dict], out, per_batch_mean: bool = False) -> dict:
    """One plain-PyTorch update from `init` over `batches` (no DDP, no Lightning)."""
    module, _ = _module(out)
    module.model.load_state_dict(init)
    module.train()
    losses, sizes = [], []
    for b in batches:
        logits, _ = module.model(**b["net_input"])  # (B, T, V)
        o = module.criterion(logits, b["target"])
        losses.append(o.loss)
        sizes.append(float(module.criterion.sample_size(o)))
    if per_batch_mean:  # what averaging per-rank token means would give (the wrong answer)
        loss = sum(l_ / s for l_, s in zip(losses, sizes)) / len(batches)
    else:  # fairseq: sum of the losses / tokens of the whole update
        loss = sum(losses) / sum(sizes)
    loss.backward()
    opt = build_optimizer(module.model.parameters(), module.optim_cfg)
    opt.step()
    return {k: v.detach().clone() for k, v in module.model.state_dict().items()}


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_one_update_equals_a_single_process_over_both_ranks_batches(ddp_run, tiny_data):
    r0, r1 = ddp_run["ranks"]
    assert (r0["rank"], r1["rank"], r0["world"], r1["world"]) == (0, 1, 2, 2)
    assert _max_diff(r0["init"], r1["init"]) == 0.0
    assert _max_diff(r0["after_first_update"], r1["after_first_update"]) == 0.0
    assert r0["lr"] == 0.25 and not r0["dummy"][0] and not r1["dummy"][0]

    batches = [r0["first_batch"], r1["first_batch"]]
    reference = _step_from(r0["init"], batches, ddp_run["out"])
    assert _max_diff(reference, r0["after_first_update"]) <= 1e-5
    # The check has teeth: the update is large next to 1e-5, and averaging the two ranks'
    # per-token means (their token counts differ: 244 and 239 here) lands ~1e-4 away.
    assert _max_diff(r0["init"], r0["after_first_update"]) > 1e-3
    pad = DataBin(tiny_data["databin"]).tgt_dict.pad()
    ntok = [int(b["target"].ne(pad).sum()) for b in batches]
    assert ntok[0] != ntok[1]
    wrong = _step_from(r0["init"], batches, ddp_run["out"], per_batch_mean=True)
    assert _max_diff(wrong, r0["after_first_update"]) > 5e-5


def test_union_of_first_batches_as_one_batch_gives_the_same_update(ddp_run, tiny_data):
    r0, r1 = ddp_run["ranks"]
    databin = DataBin(tiny_data["databin"])
    src, tgt = databin.split("train")
    ds = LanguagePairDataset(src, tgt, pad=databin.tgt_dict.pad(), eos=databin.tgt_dict.eos())
    union = ds.collater([ds[i] for i in r0["batches"][0] + r1["batches"][0]])
    reference = _step_from(r0["init"], [union], ddp_run["out"])
    assert _max_diff(reference, r0["after_first_update"]) <= 1e-5


def test_every_real_sentence_once_and_equal_steps_per_rank(ddp_run, tiny_data):
    r0, r1 = ddp_run["ranks"]
    n_train = len(DataBin(tiny_data["databin"]).split("train")[0])
    assert len(r0["batches"]) == len(r1["batches"]) == r0["updates"] == r1["updates"] == 10
    # 19 batches over 2 ranks: rank 1's last step is a dummy (it repeats a real batch).
    assert r0["dummy"] == [False] * 10 and r1["dummy"] == [False] * 9 + [True]
    real = [i for r in (r0, r1) for b, d in zip(r["batches"], r["dummy"]) if not d for i in b]
    assert sorted(real) == list(range(n_train))  # none missing, none twice


def _evaluate(module: ConvSeqModule, ds: LanguagePairDataset) -> float:
    """Loss in bits per token over a whole split, one process, batches of 16 sentences."""
    loss = size = 0.0
    module.eval()
    with torch.no_grad():
        for start in range(0, len(ds), 16):
            batch = ds.collater([ds[i] for i in range(start, min(start + 16, len(ds)))])
            logits, _ = module.model(**batch["net_input"])  # (B, T, V)
            o = module.criterion(logits, batch["target"])
            loss += float(o.loss)
            size += float(module.criterion.sample_size(o))
    return loss / size / math.log(2)


def test_valid_and_test_figures_count_each_sentence_once(ddp_run, tiny_data):
    out = ddp_run["out"]
    summary = json.loads((out / "summary.json").read_text())
    databin = DataBin(tiny_data["databin"])
    pad, eos = databin.tgt_dict.pad(), databin.tgt_dict.eos()
    module, ckpt = _module(out)
    module.load_state_dict(ckpt["state_dict"])  # the end of epoch 1 (= best.ckpt, one epoch)
    valid = LanguagePairDataset(*databin.split("valid"), pad=pad, eos=eos)
    test = LanguagePairDataset(*databin.split("test"), pad=pad, eos=eos)
    assert summary["history"][0]["valid/loss"] == pytest.approx(_evaluate(module, valid), rel=1e-5)
    assert summary["test"]["test/loss"] == pytest.approx(_evaluate(module, test), rel=1e-5)


def test_only_rank_0_writes_and_prints(ddp_run):
    out = ddp_run["out"]
    rank0, rank1 = ddp_run["writes"]
    assert rank1 == []
    written = {w.split(" ", 1)[1] for w in rank0}
    assert str(out / "csv" / "metrics.csv") in written
    assert any(w.startswith(str(out / "checkpoints" / ".last.ckpt.")) for w in written)
    assert any(w.startswith(str(out / ".summary.json")) for w in written)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    assert ddp_run["stdout"].count("convseq: 1 epoch, 10 updates") == 1


def test_two_gloo_ranks_train_a_model_with_unused_parameters(launch):
    work, proc = launch
    work = work / "unused"
    assert "get no gradient (encoder." in proc.stdout + proc.stderr
    assert "find_unused_parameters on" in proc.stdout + proc.stderr
    ranks = [torch.load(work / "record" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert [r["updates"] for r in ranks] == [4, 4]  # past the second step, where DDP failed
    last = torch.load(work / "out" / "checkpoints" / "last.ckpt", weights_only=True)
    weights = {k.removeprefix("model."): v for k, v in last["state_dict"].items()}
    init = ranks[0]["init"]
    assert all(torch.equal(weights[k], init[k]) for k in init if k.startswith("encoder."))
    assert not torch.equal(weights["decoder.fc3.bias"], init["decoder.fc3.bias"])
