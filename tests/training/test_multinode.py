"""Two nodes of one process each, on one machine (CPU, gloo, 127.0.0.1): `torchrun` on every node,
and Lightning's own multi-node launch (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, NODE_RANK).

For each launcher: the two node commands, SIGTERM to node 1 early in epoch 2, then the same two
commands plus `resume=true`. The run ends with the weights of Lightning's one-node two-process
run (`python run.py trainer=ddp trainer.accelerator=cpu`), bit for bit, which also shows that
the batches are sharded by global rank as on one node; the run folder, given to both nodes, holds
global rank 0's files and node 1's own log only; validation and test BLEU equal one process'.

Slow (a minute and more on 2 cores): `pytest -m slow tests/training/test_multinode.py`.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from tests.conftest import run_folder_names
from tests.training.run_py import (
    assert_same_weights,
    finish,
    free_port,
    one_process_bleu,
    signal_in_epoch_2,
    start,
)
from tests.training_utils import launch_env

pytestmark = pytest.mark.slow

DDP = ["trainer=ddp", "trainer.accelerator=cpu"]
TWO_NODES = [*DDP, "trainer.num_nodes=2", "trainer.devices=1"]
# what rank 0 writes into the run folder; node 1 adds only its log
RANK0_FILES = [".hydra", "checkpoints", "csv", "generate-test.txt", "run.log", "summary.json"]
NODE1_LOG = "train_node1_process_0.log"


@pytest.fixture(scope="module")
def one_node(tiny_data, tmp_path_factory) -> Path:
    """Lightning's one-node two-process run of the same settings, uninterrupted."""
    out = tmp_path_factory.mktemp("one_node") / "run"
    env = launch_env(CONVSEQ_CACHE=str(tiny_data["cache"]))
    finish(start(tiny_data, out, *DDP, env=env))
    return out


def torchrun_nodes(tiny_data, out: Path, *extra: str) -> list:
    """`torchrun --nnodes 2 --nproc-per-node 1 --node-rank N ...` for N = 0, 1."""
    port, env = free_port(), launch_env(CONVSEQ_CACHE=str(tiny_data["cache"]))
    return [
        start(
            tiny_data,
            out,
            *TWO_NODES,
            *extra,
            env=env,
            launcher=[
                sys.executable,
                "-m",
                "torch.distributed.run",  # = torchrun
                "--nnodes=2",
                "--nproc-per-node=1",
                f"--node-rank={node}",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
            ],
        )
        for node in (0, 1)
    ]


def lightning_nodes(tiny_data, out: Path, *extra: str) -> list:
    """`MASTER_ADDR=127.0.0.1 MASTER_PORT=P WORLD_SIZE=2 NODE_RANK=N python run.py ...`."""
    port = free_port()
    base = launch_env(CONVSEQ_CACHE=str(tiny_data["cache"]))  # no inherited rank variables
    return [
        start(
            tiny_data,
            out,
            *TWO_NODES,
            *extra,
            env={
                **base,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "WORLD_SIZE": "2",
                "NODE_RANK": str(node),
            },
        )
        for node in (0, 1)
    ]


# launcher -> (start both nodes, node 0's and node 1's exit status after SIGTERM to node 1):
# torchrun reports a worker's non-zero status as its own failure (1)
LAUNCHERS = {
    "torchrun": (torchrun_nodes, (1, 1)),
    "lightning": (lightning_nodes, (75, 0)),
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_two_nodes_cut_and_resumed_end_with_the_one_node_runs_weights(
    launcher, one_node, tiny_data, tmp_path
):
    nodes, cut_status = LAUNCHERS[launcher]
    out = tmp_path / "run"
    node0, node1 = nodes(tiny_data, out)
    signal_in_epoch_2(node1, out, signal.SIGTERM)  # to node 1 only
    printed = finish(node0, cut_status[0]) + finish(node1, cut_status[1])
    cut = json.loads((out / "summary.json").read_text())
    assert cut["interrupted"] and "SIGTERM during epoch 2" in cut["stop_reason"], cut
    assert cut["stopped_at"]["epoch"] == 2 and cut["stopped_at"]["mid_epoch"]

    for node in nodes(tiny_data, out, "resume=true"):
        printed += finish(node)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"] and not summary["interrupted"] and summary["epochs"] == 2
    assert_same_weights(one_node, out)

    # one run folder, written once: global rank 0's files, node 1's log and nothing else
    assert run_folder_names(out) == sorted([*RANK0_FILES, NODE1_LOG])
    assert list(tmp_path.iterdir()) == [out]
    assert "GLOBAL_RANK: 1" in (out / NODE1_LOG).read_text()
    assert "GLOBAL_RANK: 1" not in (out / "run.log").read_text()
    assert printed.count("convseq: 2 epochs") == 1  # only rank 0 prints the summary line
    # BLEU translated by both nodes: the one-process figures of the same weights
    for epoch, h in enumerate(summary["history"], start=1):
        ckpt = out / "checkpoints" / f"epoch{epoch:03d}.ckpt"
        assert h["valid/bleu"] == one_process_bleu(tiny_data, ckpt, "valid"), epoch
    best = Path(summary["best_checkpoint"])
    assert summary["test"]["test/bleu"] == one_process_bleu(tiny_data, best, "test")
