"""The job log's lines by time and its stop line, in process with a fake clock (no test sleeps):
a slow run gets its first line about 30 s into training, well before log_every_n_steps updates;
a fast run gets no line more often than the interval, and no more lines than
log_every_n_steps gives where those come often enough; a run stopped inside an epoch says how
much of that epoch it trained."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from convseq.training.progress import ProgressLines

UPDATE = re.compile(r"^epoch (\d+) \| update (\d+)/(\d+) \((\d+)\)")
pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),  # Lightning's tips on the loader
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),  # Lightning's use of torch's pytree
]


class _Clock:
    """A clock the model's updates move forward."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Steps(pl.LightningModule):
    """`batches` updates an epoch of a 2-weight layer; each takes `seconds` on the fake clock.
    Its `history` is ConvSeqModule's: a record at each epoch's end, with the updates so far."""

    def __init__(self, clock: _Clock, seconds: float, batches: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.clock, self.seconds, self.batches = clock, seconds, batches
        self.history: list[dict[str, int]] = []

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.ones(self.batches, 2)), batch_size=1)

    def training_step(self, batch, batch_idx):
        self.clock.now += self.seconds
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_epoch_end(self) -> None:
        self.history.append({"epoch": self.current_epoch + 1, "updates": self.global_step})


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def written() -> Iterator[dict[str, list[str]]]:
    """The lines ProgressLines writes, by format (its loggers keep a handler they find)."""
    kept = {}
    saved = []
    for fmt, name in (("lines", "convseq.progress"), ("json", "convseq.progress.json")):
        log = logging.getLogger(name)
        saved.append((log, log.level, log.propagate))
        handler = _Keep()
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
        kept[fmt] = handler
    yield {fmt: handler.lines for fmt, handler in kept.items()}
    for (log, level, propagate), handler in zip(saved, kept.values()):
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


def _fit(
    seconds: float,
    batches: int,
    log_every: int,
    fmt: str = "lines",
    every_seconds: float | None = None,  # None: ProgressLines' default
    **trainer_args,
) -> None:
    clock = _Clock()
    extra = {} if every_seconds is None else {"every_seconds": every_seconds}
    lines = ProgressLines(fmt, clock=clock, **extra)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=log_every,
        callbacks=[lines],
        **{"max_epochs": 1, **trainer_args},
    )
    trainer.fit(_Steps(clock, seconds, batches))


def _updates(lines: list[str]) -> list[int]:
    return [int(m.group(4)) for line in lines if (m := UPDATE.match(line))]


def test_a_slow_run_writes_its_first_line_about_30_seconds_in(written):
    # 6 s an update (the Multi30k recipe on 2 cores), a line every 50 updates asked for
    _fit(seconds=6.0, batches=12, log_every=50)
    lines = written["lines"]
    # at the first update 30 s after the start and 30 s after that line: updates 5 and 10
    assert _updates(lines) == [5, 10]
    first = next(line for line in lines if UPDATE.match(line))
    assert "| elapsed 0:00:30 |" in first and "| epoch eta 0:00:42" in first
    # no figures: Lightning logged none at these updates
    assert "| loss " not in first and "| lr " not in first
    assert lines[-1].startswith("stopped: finished | epochs 1 | updates 12 | elapsed 0:01:12")


@pytest.mark.parametrize(
    ("log_every", "expected"),
    [
        (1000, [16, 32, 48, 64]),  # by time alone: one a second (16 updates)
        (8, [8, 16, 24, 32, 40, 48, 56, 64]),  # every 8 updates (0.5 s): nothing added by time
        (24, [16, 24, 40, 48, 64]),  # by time a second after the last line of either kind
    ],
)
def test_lines_by_time_come_no_more_often_than_the_interval(written, log_every, expected):
    _fit(seconds=1 / 16, batches=64, log_every=log_every, every_seconds=1.0)
    assert _updates(written["lines"]) == expected


def test_a_fast_run_gets_only_its_interval_lines(written):
    # the toy run's pace (about 60 updates a second) with the default interval of 50 updates
    _fit(seconds=1 / 64, batches=256, log_every=50)
    assert _updates(written["lines"]) == [50, 100, 150, 200, 250]


def test_json_marks_the_lines_by_time(written):
    _fit(seconds=6.0, batches=12, log_every=4, fmt="json")
    records = [json.loads(x) for x in written["json"]]
    updates = [r for r in records if r["kind"] == "update"]
    # every 4 updates (24 s) by count; none by time, each comes before 30 s have passed
    assert [(r["updates"], r["logged"]) for r in updates] == [(4, True), (8, True), (12, True)]
    written["json"].clear()
    _fit(seconds=6.0, batches=12, log_every=50, fmt="json")
    updates = [json.loads(x) for x in written["json"] if '"update"' in x]
    assert [(r["updates"], r["logged"]) for r in updates] == [(5, False), (10, False)]
    assert not any("loss" in r for r in updates)


@pytest.mark.parametrize(
    ("trainer_args", "stop_line", "trained"),
    [
        ({"max_steps": 7}, "| epochs 0 and update 7/20 of epoch 1 | updates 7 |", 7 / 20),
        (
            {"max_steps": 27, "max_epochs": 3},
            "| epochs 1 and update 7/20 of epoch 2 | updates 27 |",
            1 + 7 / 20,
        ),
        ({"max_steps": 20, "max_epochs": 3}, "| epochs 1 | updates 20 |", 1.0),
        ({"max_epochs": 2}, "| epochs 2 | updates 40 |", 2.0),
    ],
)
def test_the_stop_line_counts_a_partial_epoch_as_such(written, trainer_args, stop_line, trained):
    _fit(seconds=0.5, batches=20, log_every=50, **trainer_args)
    assert stop_line in written["lines"][-1]
    _fit(seconds=0.5, batches=20, log_every=50, fmt="json", **trainer_args)
    stop = json.loads(written["json"][-1])
    assert stop["kind"] == "stop" and stop["epochs_trained"] == pytest.approx(trained)
    assert stop["epochs"] == int(trained)  # the epochs completed


def test_the_interval_by_time_is_the_trainers_progress_seconds(tiny_data, tmp_path):
    from convseq.training.build import build_callbacks
    from tests.training_utils import tiny_config

    def every(*overrides: str) -> float:
        cfg = tiny_config(tiny_data, tmp_path / "run", "trainer.progress=lines", *overrides)
        return build_callbacks(cfg, tmp_path / "run" / "checkpoints")["progress"].every_seconds

    assert every() == 30.0  # the schema's default
    assert every("trainer.progress_seconds=5") == 5.0
    assert every("trainer.progress_seconds=0") == 0.0  # lines by update count only
