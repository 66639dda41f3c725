"""`patience=N`: stop after N validations in a row without a better `checkpoint.monitor`."""

from __future__ import annotations

from typing import Any

from pytorch_lightning.callbacks import EarlyStopping

__all__ = ["Patience"]


class Patience(EarlyStopping):
    """Lightning's EarlyStopping whose `patience` is always the command line's.

    Lightning restores `patience` from the checkpoint along with the count of validations
    without improvement, so `resume=true patience=10` on a run that `patience=5` stopped would
    stop again after its next validation. Here the count and the best value so far are the
    checkpoint's, the patience is the one given now.
    """

    def _generate_state_key(self, **kwargs: Any) -> str:
        # EarlyStopping's key in the checkpoint's callback states: checkpoints written before
        # this class existed resume their count of validations without improvement
        return f"EarlyStopping{kwargs!r}"

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        patience = self.patience
        super().load_state_dict(state_dict)
        self.patience = patience
