"""`python run.py` as a user types it, in a subprocess: the tiny 2-epoch run the DDP, multi-node
and SLURM tests share, its launchers (plain, torchrun), and the checks they all make.

The settings are tests/ddp_script.py's (so that a run.py run and a compose-API run of the same
settings end with the same weights), with dropout and validation BLEU every epoch.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from convseq.data.databin import DataBin
from convseq.evaluation.scores import corpus_scores
from convseq.inference.translator import Translator
from tests.conftest import ROOT

# ~22 updates an epoch per rank (2 ranks): a SIGTERM sent from outside has time to land mid-epoch
RUN = [
    "trainer.max_epochs=2",
    "model.dropout=0.1",
    "bleu_every_n_epochs=1",
    "batching.max_tokens=100",
]
GEN = ["gen.max_len_b=12", "gen.max_tokens=300", "checkpoint.keep_epochs=-1"]

# what tests/ddp_script.py sets besides data and the cache (RUN's keys replace its own)
DDP_SCRIPT_DEFAULTS = [
    "model.encoder_embed_dim=16",
    "model.decoder_embed_dim=16",
    "model.decoder_out_embed_dim=16",
    "model.encoder_layers=[[16,3]]",
    "model.decoder_layers=[[16,3]]",
    "optim.clip_norm=0",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
]
RUN_KEYS = {o.split("=", 1)[0] for o in RUN}


def overrides(tiny_data: Mapping[str, Path], out: Path, *extra: str) -> list[str]:
    """The command line's overrides: the tiny run over the tiny corpus, in run folder `out`."""
    return [
        "data.generator=null",
        f"data.dir={tiny_data['corpus']}",
        f"paths.cache_dir={tiny_data['cache']}",
        *(o for o in DDP_SCRIPT_DEFAULTS if o.split("=", 1)[0] not in RUN_KEYS),
        *RUN,
        *GEN,
        f"hydra.run.dir={out}",
        *extra,
    ]


def start(
    tiny_data: Mapping[str, Path],
    out: Path,
    *extra: str,
    env: Mapping[str, str],
    launcher: Sequence[str] = (),
) -> subprocess.Popen:
    """`[launcher] python run.py <overrides>` started in the run folder's parent.

    Args:
        env: the whole environment (`tests.training_utils.launch_env`, which sets one thread a
            process: two processes spinning every core of a 2-core machine run 10x slower).
        launcher: e.g. torchrun and its arguments, which then start run.py themselves.
    """
    script = (
        [*launcher, str(ROOT / "run.py")] if launcher else [sys.executable, str(ROOT / "run.py")]
    )
    return subprocess.Popen(
        [*script, *overrides(tiny_data, out, *extra)],
        cwd=out.parent,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, status: int = 0) -> str:
    """Wait for `proc`; its stdout, once its exit status is `status` (else its stderr's end)."""
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == status, err[-4000:]
    return out


def signal_in_epoch_2(proc: subprocess.Popen, out: Path, signum: int = signal.SIGTERM) -> None:
    """Send `signum` to `proc` as soon as epoch 1's checkpoint exists (early in epoch 2)."""
    epoch1 = out / "checkpoints" / "epoch001.ckpt"  # written at the very end of epoch 1
    deadline = time.monotonic() + 240
    while not epoch1.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert epoch1.exists(), proc.stderr.read()[-4000:] if proc.poll() is not None else "timeout"
    proc.send_signal(signum)


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it), for one run's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_same_weights(a_dir: Path, b_dir: Path) -> None:
    """The two run folders' last.ckpt hold the same update count and the same weights, bit for
    bit."""
    a = torch.load(a_dir / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(b_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"]
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for name, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][name]), name


def one_process_bleu(tiny_data: Mapping[str, Path], ckpt: Path, split: str) -> float:
    """BLEU of `ckpt` on `split`, translated by one process with the runs' settings."""
    lines = (tiny_data["corpus"] / f"{split}.src").read_text().splitlines()
    refs = DataBin(tiny_data["databin"]).text(split, "tgt")
    # the run's settings (gen.max_tokens=300 too, so the batches are the run's own)
    hyps = Translator.from_checkpoints(ckpt).translate(lines, 300, beam=5, max_len_b=12)
    return corpus_scores(hyps, refs).bleu
