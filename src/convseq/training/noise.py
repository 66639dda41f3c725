"""Third-party messages a user can do nothing about, filtered by their text.

Filtered: Lightning's advertisement for its cloud logger (the "Tip: ... litlogger" line), and
the deprecation warning Lightning's own `_pytree.py` raises against newer torch
(`isinstance(treespec, LeafSpec)` is deprecated). Each filter matches that message from that
package only: convseq's warnings and a user's own, even with the same words, still show.
"""

from __future__ import annotations

import logging
import re
import warnings

__all__ = ["LIGHTNING_INFO_LOGGER", "quiet_third_party"]

# the logger Lightning's rank_zero_info writes through
LIGHTNING_INFO_LOGGER = "pytorch_lightning.utilities.rank_zero"
_TIP = re.compile(r"\W*Tip: .*litlogger", re.IGNORECASE)
_PYTREE = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


class _DropLitLoggerTip(logging.Filter):
    """Drops Lightning's litlogger tip; lets every other record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _TIP.match(record.getMessage())


def quiet_third_party() -> None:
    """Install both filters (idempotent); before the Trainer is made and fit."""
    log = logging.getLogger(LIGHTNING_INFO_LOGGER)
    if not any(isinstance(f, _DropLitLoggerTip) for f in log.filters):
        log.addFilter(_DropLitLoggerTip())
    # `module` is the warning's origin: Lightning's _pytree, not a user's code
    warnings.filterwarnings("ignore", message=_PYTREE, module=r"pytorch_lightning\.")
