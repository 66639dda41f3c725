"""A run's per-epoch checkpoints, and one translation of a split by a checkpoint (`python run.py
task=generate` in its own process, read back from its generate-<split>.json): the study's one
way to find and score a checkpoint.

The result is kept in `out`: a second call with the same folder reads it instead of translating
again, so an interrupted reading picks up where it stopped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from convseq.checkpoints.average import EPOCH_FILE

ROOT = Path(__file__).resolve().parents[2]


def epoch_checkpoint(run: Path, epoch: int) -> Path:
    """`run`'s checkpoint of `epoch` (1-based), as `checkpoint.keep_epochs` names it."""
    return run / "checkpoints" / f"epoch{epoch:03d}.ckpt"


def kept_epochs(run: Path) -> dict[int, Path]:
    """Epoch -> checkpoint of every per-epoch checkpoint `run` kept, in epoch order."""
    folder = run / "checkpoints"
    found = [
        (int(m.group(1)), p)
        for p in folder.glob("epoch*.ckpt")
        if (m := EPOCH_FILE.fullmatch(p.name))
    ]
    return dict(sorted(found))


def translate(ckpt: Path, out: Path, split: str = "test", **gen: Any) -> dict[str, Any]:
    """generate-<split>.json of `ckpt` translating `split` with `gen.<key>=<value>` overrides
    (beam 5 unless given); translated once into `out`, then read from there."""
    result = out / f"generate-{split}.json"
    if not result.exists():
        if not Path(ckpt).exists():
            raise SystemExit(f"{ckpt}: missing (keep every epoch with checkpoint.keep_epochs=-1)")
        settings = {"beam": 5, **gen}
        cmd = [sys.executable, "run.py", "task=generate", f"ckpt={ckpt}", f"gen.split={split}"]
        cmd += [f"gen.{k}={v}" for k, v in settings.items()]
        cmd += [f"gen.output={out}", f"hydra.run.dir={out}"]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(result.read_text())


def bleu(ckpt: Path, out: Path, split: str = "test", **gen: Any) -> float:
    """sacreBLEU of `ckpt` on `split` (see `translate`)."""
    return float(translate(ckpt, out, split, **gen)["scores"]["bleu"])
