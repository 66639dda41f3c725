"""One epoch of DDP training on CPU (2 processes, gloo) that records what each rank did.

Run by tests/training/test_ddp.py in a subprocess, never inside pytest: Lightning's DDP launcher starts
rank 1 by re-running this command line.

    python tests/ddp_script.py CORPUS_DIR CACHE_DIR OUTPUT_DIR RECORD_DIR [KEY=VALUE ...]
        [--then OUTPUT_DIR RECORD_DIR [KEY=VALUE ...]] ...

Each ``--then`` starts one more training run after the one before ends, in the same two
processes and process group (one launch, one start-up, for runs that need no fresh process).

Extra KEY=VALUE arguments are config overrides (e.g. ``trainer.max_epochs=2 resume=true``); one
more, ``sigterm_at_step=K``, makes rank 0 send itself SIGTERM right after update K (the signal a
cluster sends), as a user interrupting the run would. ``count_syncs=1`` records, per update, the
device reads and collectives `tests/search/host_reads.DeviceReads` sees (``record["syncs"]``);
``lightning_ddp=1`` trains with Lightning's own DDPStrategy instead of convseq's.

For every run, every rank writes `RECORD_DIR/rank{r}.pt`: the weights at the start of training
and after the first update, every train batch's sentence ids and dummy flag, and the first batch
itself; and `RECORD_DIR/rank{r}_writes.json`: every file or folder it created, opened for writing
or renamed inside OUTPUT_DIR (seen through Python's audit hooks, so nothing in convseq is
patched).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 280  # 19 train batches (rank 1 gets one dummy), 3 valid batches (one dummy)
TINY = [
    "model.encoder_embed_dim=16",
    "model.decoder_embed_dim=16",
    "model.decoder_out_embed_dim=16",
    "model.encoder_layers=[[16,3]]",
    "model.decoder_layers=[[16,3]]",
    "model.dropout=0.0",  # the reference step in the test must see the same forward pass
]

THEN = "--then"

_writes: list[str] = []  # the writes of the run under way
_rank = {"value": int(os.environ.get("LOCAL_RANK", "0"))}
_watched = {"prefix": ""}  # the output folder of the run under way


def _watch_writes() -> None:
    """Record every write inside the output folder of the run under way made by this process."""
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def hook(event: str, args: tuple) -> None:
        prefix = _watched["prefix"]
        if not prefix:
            return
        if event == "open":
            path, mode, flags = args
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & write_flags
            )
            if writing and isinstance(path, (str, os.PathLike)) and str(path).startswith(prefix):
                _writes.append(f"open {path}")
        elif event in ("os.rename", "os.mkdir", "os.remove"):
            for path in args[:2]:
                if isinstance(path, (str, os.PathLike)) and str(path).startswith(prefix):
                    _writes.append(f"{event} {path}")
                    break

    sys.addaudithook(hook)


class Recorder(pl.Callback):
    """Keeps this rank's batches and its weights before and after the first update."""

    def __init__(self) -> None:
        self.record: dict[str, Any] = {"batches": [], "dummy": []}

    @staticmethod
    def _weights(module: pl.LightningModule) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in module.model.state_dict().items()}

    def on_train_start(self, trainer, module) -> None:
        _rank["value"] = trainer.global_rank
        self.record.update(rank=trainer.global_rank, world=trainer.world_size)
        self.record["strategy"] = type(trainer.strategy).__name__
        self.record["init"] = self._weights(module)

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.record["batches"].append(batch["id"].tolist())
        self.record["dummy"].append(bool(batch.get("is_dummy", False)))
        if batch_idx == 0:
            self.record["first_batch"] = {
                "net_input": {k: v.clone() for k, v in batch["net_input"].items()},
                "target": batch["target"].clone(),
            }

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.record["updates"] = trainer.global_step  # also known when a signal ends the run
        if batch_idx == 0:
            self.record["after_first_update"] = self._weights(module)
            self.record["lr"] = trainer.optimizers[0].param_groups[0]["lr"]

    def on_train_end(self, trainer, module) -> None:
        self.record["updates"] = trainer.global_step


def _record_translations(current: dict[str, Any]) -> None:
    """Keep the sentence ids of every batch this rank translates (validation and test BLEU) in
    ``current["record"]``, the record of the run under way."""
    from convseq.inference.translator import Translator

    translate_batch = Translator.translate_batch

    def recording(self, batch, *args, **kwargs):
        current["record"]["translated"].append(batch["id"].tolist())
        return translate_batch(self, batch, *args, **kwargs)

    Translator.translate_batch = recording


class SigtermAt(pl.Callback):
    """Rank 0 sends itself SIGTERM at the end of update `step` (global step)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_rank == 0 and trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class SyncCounter(pl.Callback):
    """Host reads and collectives of every update, from one batch end to the next.

    The window of update k runs from the end of update k-1 (the start of training for the
    first) to the end of update k: it holds whatever Lightning's loop does before a batch.
    """

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.mode: Any = None

    def _now(self) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        return dict(self.mode.by_name), dict(self.mode.collectives), dict(self.mode.sites)

    def on_train_start(self, trainer, module) -> None:
        sys.path.insert(0, str(ROOT))
        from tests.search.host_reads import DeviceReads

        self.mode = DeviceReads(sites=True).__enter__()
        self.record["syncs"] = []
        self.last = self._now()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        now = self._now()
        delta = tuple(
            {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
            for after, before in zip(now, self.last)
        )
        self.record["syncs"].append({"reads": delta[0], "collectives": delta[1], "sites": delta[2]})
        self.last = now

    def on_train_end(self, trainer, module) -> None:
        self.mode.__exit__(None, None, None)


def _runs(args: list[str]) -> list[tuple[Path, Path, list[str]]]:
    """OUTPUT_DIR RECORD_DIR [KEY=VALUE ...], once per run, the runs parted by ``--then``."""
    runs, run = [], []
    for arg in [*args, THEN]:
        if arg != THEN:
            run.append(arg)
            continue
        assert len(run) >= 2, f"each run needs OUTPUT_DIR RECORD_DIR: {args}"
        runs.append((Path(run[0]).absolute(), Path(run[1]).absolute(), run[2:]))
        run = []
    return runs


def _train(
    corpus: Path, cache: Path, output_dir: Path, record_dir: Path, args: list[str], current: dict
) -> None:
    """One training run: `args` are its overrides and this script's own options."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import convseq.training.build as build
    from convseq.tasks.config import as_config
    from convseq.tasks.train import train

    options = ("sigterm_at_step=", "count_syncs=", "lightning_ddp=")
    extra = [a for a in args if not a.startswith(options)]
    sigterm = [int(a.split("=", 1)[1]) for a in args if a.startswith("sigterm_at_step=")]
    count_syncs = "count_syncs=1" in args
    strategy_argument = build.strategy_argument
    if "lightning_ddp=1" in args:  # Lightning's DDPStrategy, as before convseq's
        build.strategy_argument = lambda name: name
    record_dir.mkdir(parents=True, exist_ok=True)
    _writes.clear()
    _watched["prefix"] = str(output_dir)

    GlobalHydra.instance().clear()
    overrides = [
        "data.generator=null",
        f"data.dir={corpus}",
        f"paths.cache_dir={cache}",
        f"batching.max_tokens={MAX_TOKENS}",
        *TINY,
        "optim.clip_norm=0",  # clipping would hide a wrong normalisation factor
        "trainer.accelerator=cpu",
        "trainer.strategy=ddp",
        "trainer.devices=2",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        "trainer.log_every_n_steps=1",
    ]
    given = {e.split("=", 1)[0] for e in extra}  # an extra argument replaces a default
    overrides = [o for o in overrides if o.split("=", 1)[0] not in given] + extra
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    GlobalHydra.instance().clear()
    cfg.paths.output_dir = str(output_dir)
    recorder = Recorder()
    recorder.record["translated"] = []
    current["record"] = recorder.record
    callbacks: list[pl.Callback] = [recorder, *(SigtermAt(k) for k in sigterm)]
    if count_syncs:
        callbacks.append(SyncCounter(recorder.record))
    try:
        train(as_config(cfg), callbacks=callbacks)
    finally:
        build.strategy_argument = strategy_argument
        _watched["prefix"] = ""
        (record_dir / f"rank{_rank['value']}_writes.json").write_text(json.dumps(_writes))
    torch.save(recorder.record, record_dir / f"rank{recorder.record['rank']}.pt")


def main() -> None:
    corpus, cache = (Path(a).absolute() for a in sys.argv[1:3])
    runs = _runs(sys.argv[3:])
    torch.set_num_threads(1)
    _watch_writes()

    from convseq.cli.schema import register_configs

    register_configs()
    current: dict[str, Any] = {"record": {"translated": []}}
    _record_translations(current)
    for output_dir, record_dir, args in runs:
        _train(corpus, cache, output_dir, record_dir, args, current)
    # every record is written: leave the process group and the logs, then skip the interpreter's
    # teardown of torch and Lightning's modules (seconds a rank)
    logging.shutdown()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
