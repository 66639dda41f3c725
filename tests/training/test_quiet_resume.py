"""`resume=true` shows no raw Lightning line that says nothing to a user: Lightning's
"Checkpoint directory ... exists and is not empty." (its ModelCheckpoint, on the resumed run's
own folder) is filtered, and only that warning, only from there.
"""

from __future__ import annotations

import signal
import warnings

from convseq.training.build import hide_checkpoint_dir_warning
from tests.training.test_resume import SendSignal
from tests.training_utils import last_checkpoint, summary, tiny_config, train_one_thread

LINE = "exists and is not empty"
ONE_EPOCH = ("trainer.max_epochs=1", "final_test=false")  # 18 updates


def _shown(caught: list[warnings.WarningMessage]) -> list[str]:
    return [f"{w.filename}: {w.message}" for w in caught]


def test_a_resumed_run_shows_no_checkpoint_directory_line(tiny_data, tmp_path, capfd):
    run = tmp_path / "run"
    train_one_thread(tiny_config(tiny_data, run, *ONE_EPOCH), [SendSignal(signal.SIGTERM, 3)])
    assert summary(run)["signal"] == "SIGTERM"
    saved = last_checkpoint(run)["global_step"]
    assert 0 < saved < 18  # a mid-epoch last.ckpt: the folder the resumed run writes into
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning, as a fresh process shows it once
        train_one_thread(tiny_config(tiny_data, run, *ONE_EPOCH, "resume=true"))
    out, err = capfd.readouterr()
    assert summary(run)["updates"] == 18 and summary(run)["signal"] is None  # it did resume
    assert not [m for m in _shown(caught) if LINE in m], _shown(caught)
    assert LINE not in out + err
    assert "Checkpoint directory" not in out + err


def _warn_from(module: str, message: str) -> list[str]:
    """Warnings shown for `message` raised from code whose module is `module`, with the filter
    `build_trainer` installs."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hide_checkpoint_dir_warning()
        exec(
            compile("import warnings\nwarnings.warn(m, UserWarning)", "<x>", "exec"),
            {"__name__": module, "m": message},
        )
    return [str(w.message) for w in caught]


def test_only_that_warning_from_lightnings_checkpoint_callback_is_filtered():
    message = "Checkpoint directory /runs/x/checkpoints exists and is not empty."
    assert _warn_from("pytorch_lightning.callbacks.model_checkpoint", message) == []
    # the same words from a user's code or convseq's, and Lightning's other warnings, still show
    assert _warn_from("my_script", message) == [message]
    assert _warn_from("convseq.training.module", message) == [message]
    other = "The number of training batches (3) is smaller than the logging interval"
    assert _warn_from("pytorch_lightning.callbacks.model_checkpoint", other) == [other]
    csv = "Experiment logs directory /runs/x exists and is not empty."
    assert _warn_from("lightning_fabric.loggers.csv_logs", csv) == [csv]
