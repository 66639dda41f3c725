"""The `report` group: how a sweep's summary is written (`convseq.evaluation.report`), after
every multirun of training and by task=report."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReportConfig"]


@dataclass
class ReportConfig:
    """The sweep summary (`task=report`, and after every multirun)."""

    test: bool = False  # also list test figures (settings are chosen on validation)
    x: str = "epoch"  # epoch | updates: what sweep_curves.png is drawn against
