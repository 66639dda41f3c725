"""Third-party noise filtered by message (convseq.training.noise), and nothing else: convseq's
warnings and a user's own still show."""

from __future__ import annotations

import logging
import warnings

import pytest

from convseq.training.noise import LIGHTNING_INFO_LOGGER, quiet_third_party

TIP = (
    "💡 Tip: For seamless cloud logging and experiment tracking, try installing "
    "[litlogger](https://pypi.org/project/litlogger/) to enable LitLogger"
)
PYTREE = "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec)`"


@pytest.fixture
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        quiet_third_party()
        yield


def test_the_litlogger_tip_is_dropped_other_lightning_lines_pass(quiet, caplog):
    log = logging.getLogger(LIGHTNING_INFO_LOGGER)
    with caplog.at_level(logging.INFO):
        log.info(TIP)
        log.info("GPU available: False, used: False")
        log.info("Tip: use a bigger batch")  # a tip about something else
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["GPU available: False, used: False", "Tip: use a bigger batch"]


def _warn_from(module: str, message: str) -> list[str]:
    """Warnings shown for `message` raised from code whose module is `module`."""
    with warnings.catch_warnings(record=True) as caught:
        quiet_third_party()  # again inside the block: catch_warnings restores the filters
        exec(
            compile("import warnings\nwarnings.warn(m, FutureWarning)", "<x>", "exec"),
            {"__name__": module, "m": message},
        )
    return [str(w.message) for w in caught]


def test_the_pytree_warning_from_lightning_is_dropped():
    assert _warn_from("pytorch_lightning.utilities._pytree", PYTREE) == []


def test_the_same_words_from_a_user_or_convseq_still_show():
    assert _warn_from("my_script", PYTREE) == [PYTREE]
    assert _warn_from("convseq.training.module", PYTREE) == [PYTREE]
    other = "something else is deprecated"
    assert _warn_from("pytorch_lightning.trainer", other) == [other]
