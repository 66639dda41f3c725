"""Read back what each experiment tracker wrote, with the tracker's own reader, as series.

A series is a Counter of (step, figure, value): a figure logged twice at a step (a resumed run
repeating what it already logged) counts twice, so comparing series also catches duplicates.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from convseq.evaluation.history import read_metrics

# figures whose values depend on timing, and Lightning's own bookkeeping columns
TIMED = ("wps", "ups", "time", "_runtime", "_timestamp")
NOT_FIGURES = ("step", "epoch", "trainer/global_step", "_step")
DIGITS = 6  # trackers keep float32 values; metrics.csv their float64 repr


def _key(step: float, name: str, value: float) -> tuple[int, str, float]:
    return int(step), name, float(f"{float(value):.{DIGITS}g}")


def keep(name: str) -> bool:
    """A figure compared between runs: logged by convseq, not dependent on timing."""
    return name not in NOT_FIGURES and not name.endswith(TIMED) and "/" in name


def csv_series(run: Path) -> Counter:
    """metrics.csv's figures, as (step, figure, value)."""
    found: Counter = Counter()
    for row in read_metrics(run / "csv" / "metrics.csv"):
        for name, value in row.items():
            if keep(name):
                found[_key(row["step"], name, value)] += 1
    return found


def tensorboard_series(run: Path) -> Counter:
    """The scalars of <run>/tensorboard, read by TensorBoard's EventAccumulator (which drops the events a
    resumed run's purge_step discards)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    found: Counter = Counter()
    for tag in acc.Tags()["scalars"]:
        if keep(tag):
            for event in acc.Scalars(tag):
                found[_key(event.step, tag, event.value)] += 1
    return found


def tensorboard_hparams(run: Path) -> dict[str, Any]:
    """The hyperparameters of TensorBoard's HPARAMS tab (its plugin data in <run>/tensorboard)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {k: getattr(v, v.WhichOneof("kind")) for k, v in info.hparams.items()}


def mlflow_series(client: Any, run_id: str) -> Counter:
    """Every metric history of an MLflow run, read by `MlflowClient`."""
    found: Counter = Counter()
    for name in client.get_run(run_id).data.metrics:
        if keep(name):
            for m in client.get_metric_history(run_id, name):
                found[_key(m.step, name, m.value)] += 1
    return found


def _wandb_frames(path: Path) -> Iterator[bytes]:
    """The records of a .wandb file: a 7-byte header (':W&B', magic, version), then records in
    32 KiB blocks, each chunk behind a 7-byte header (checksum, length, type: 1 full, 2 first,
    3 middle, 4 last), LevelDB's log layout."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            yield pending
            pending = b""


def wandb_records(run: Path) -> list[tuple[str, Any]]:
    """(type, record) of every offline W&B run file under <run>/wandb, oldest first, parsed with
    W&B's own protobuf messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    records = []
    for path in sorted((run / "wandb").glob("offline-run-*/*.wandb")):
        for frame in _wandb_frames(path):
            record = pb.Record()
            record.ParseFromString(frame)
            records.append((record.WhichOneof("record_type"), record))
    return records


def wandb_series(run: Path) -> Counter:
    """The history rows of the offline W&B runs, at their `trainer/global_step`."""
    found: Counter = Counter()
    for kind, record in wandb_records(run):
        if kind != "history":
            continue
        row = {
            i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item
        }
        for name, value in row.items():
            if keep(name) and isinstance(value, (int, float)):
                found[_key(row["trainer/global_step"], name, value)] += 1
    return found


def wandb_config(run: Path) -> dict[str, Any]:
    """The W&B config (nested), its updates applied in order."""
    config: dict[str, Any] = {}
    for kind, record in wandb_records(run):
        if kind == "config":
            for item in record.config.update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return config
