"""A causal convolution that decodes one position at a time (fairseq's LinearizedConvolution)."""

from __future__ import annotations

import uuid

import torch

from convseq.modules.conv_tbc import ConvTBC

IncrementalState = dict[str, object]  # the caller-owned cache of one decoding run


class LinearizedConvolution(ConvTBC):
    """A causal TBC convolution: output t sees inputs t-k+1 .. t, zeros before the start.

    Full-sequence mode pads k-1 zeros on each side and drops the last k-1 outputs. Incremental
    mode keeps the last k inputs of each row in the caller's ``incremental_state`` and computes
    one output from them as a single matrix product, so a decoding step costs one position.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__(in_channels, out_channels, kernel_size, padding=kernel_size - 1)
        # names this module's entries in an incremental_state shared by the whole decoder
        self._state_key = f"{uuid.uuid4().hex}.input_buffer"

    def forward(
        self, x: torch.Tensor, incremental_state: IncrementalState | None = None
    ) -> torch.Tensor:
        """Full sequence: (T, B, C_in) -> (T, B, C_out). Incremental: (B, 1, C_in) -> (B, 1, C_out)."""
        if incremental_state is None:
            out = super().forward(x)  # (T + k - 1, B, C_out)
            k = self.kernel_size[0]
            return out[: out.size(0) - (k - 1)] if k > 1 else out  # (T, B, C_out)
        return self._step(x, incremental_state)

    def _step(self, x: torch.Tensor, incremental_state: IncrementalState) -> torch.Tensor:
        # like fairseq, one step never builds an autograd graph: buffers would otherwise keep
        # every earlier step's graph alive
        with torch.no_grad():
            k = self.kernel_size[0]
            rows = x.size(0)
            if k > 1:
                buffer = incremental_state.get(self._state_key)
                if buffer is None:  # zeros stand for the causal left padding
                    buffer = x.new_zeros(rows, k, x.size(2))  # (B, k, C_in)
                # oldest -> newest; a new tensor each step, so a reordered or saved state is
                # never written through
                buffer = torch.cat([buffer[:, 1:], x[:, -1:]], dim=1)  # (B, k, C_in)
                incremental_state[self._state_key] = buffer
                frames = buffer.reshape(rows, k * x.size(2))  # (B, k * C_in), index j*C_in + c
            else:
                frames = x[:, -1]  # (B, C_in)
            out = self._step_product(frames)  # (B, C_out)
        return out.unsqueeze(1)  # (B, 1, C_out)

    def _step_product(self, frames: torch.Tensor) -> torch.Tensor:
        """(B, k * C_in) frames -> (B, C_out): the step's one matrix product (plus bias)."""
        k = self.kernel_size[0]
        # weight (k, C_in, C_out) viewed as (k * C_in, C_out) matches the frame layout:
        # no transposed copy of the weight per step
        weight = self.weight.reshape(k * self.in_channels, self.out_channels)
        return torch.addmm(self.bias, frames, weight)  # (B, C_out)

    def reorder_incremental_state(
        self, incremental_state: IncrementalState, new_order: torch.Tensor
    ) -> None:
        """Keep row ``new_order[i]``'s buffer as row ``i`` (beam reordering, batch shrinking)."""
        buffer = incremental_state.get(self._state_key)
        if buffer is not None:
            incremental_state[self._state_key] = buffer.index_select(0, new_order)
