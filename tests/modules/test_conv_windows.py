"""The helpers both convolutions share, against direct formulas."""

from __future__ import annotations

import torch

from convseq.modules.conv_windows import (
    band_matrix,
    default_unfold,
    incremental_windows,
    padded_windows,
    reorder_cache,
    valid_taps,
)


def test_windows_hold_the_inputs_each_tap_reads_zeros_outside():
    x = torch.arange(1.0, 6.0).view(5, 1, 1)  # (T=5, B=1, C=1): values 1..5
    windows = padded_windows(x, kernel_size=3, padding_l=1)  # (5, 1, 1, 3)
    for t in range(5):
        expected = [float(t + k) if 0 <= t - 1 + k < 5 else 0.0 for k in range(3)]
        assert windows[t, 0, 0].tolist() == expected


def test_band_matrix_times_input_is_the_windowed_sum():
    torch.manual_seed(0)
    x = torch.randn(7, 1, 1)  # (T, B, C)
    w = torch.randn(1, 7, 4)  # (N=1, T, K)
    for padding_l in range(4):
        band = band_matrix(w, padding_l)[0]  # (T, T)
        direct = (padded_windows(x, 4, padding_l)[:, 0, 0] * w[0]).sum(-1)  # (T,)
        torch.testing.assert_close(band @ x[:, 0, 0], direct)


def test_valid_taps_marks_reads_inside_the_sequence():
    valid = valid_taps(0, 3, kernel_size=3, padding_l=2, length=3, device=torch.device("cpu"))
    assert valid.tolist() == [[False, False, True], [False, True, True], [True, True, True]]


def test_incremental_windows_equal_the_full_windows_step_by_step_or_at_once():
    torch.manual_seed(0)
    x = torch.randn(6, 2, 3)  # (T, B, C)
    full = padded_windows(x, 4, 3)
    for split in ([1] * 6, [2, 3, 1], [6]):
        state: dict[str, object] = {}
        parts, start = [], 0
        for n in split:
            windows, first = incremental_windows(x[start : start + n], state, "k", 4, 3)
            assert first == min(start, 3)
            parts.append(windows)
            start += n
        torch.testing.assert_close(torch.cat(parts), full)
        buffer, seen = state["k"]  # (B, C, K - 1): the last K - 1 inputs, and how many came
        assert buffer.shape == (2, 3, 3) and seen == 6
        torch.testing.assert_close(buffer, x[-3:].permute(1, 2, 0))


def test_reorder_cache_moves_rows_and_default_form():
    state: dict[str, object] = {"k": (torch.arange(4.0).view(4, 1, 1), 5)}  # (B, C, K - 1)
    reorder_cache(state, "k", torch.tensor([3, 0]))
    assert state["k"][0].view(-1).tolist() == [3.0, 0.0] and state["k"][1] == 5
    assert not default_unfold(512) and default_unfold(513) and default_unfold(5, incremental=True)
