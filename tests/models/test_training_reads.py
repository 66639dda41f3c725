"""A training forward pass reads nothing back from the device: whether the source batch holds
padding is decided on the device (`encoder_has_padding`), with the logits of the host-decided
path bit for bit."""

from __future__ import annotations

import pytest
import torch

from tests.models.test_fconv import left_padded, prefixes, small_model
from tests.search.host_reads import HostReads


@pytest.mark.parametrize(
    ("lengths", "dtype"),
    [
        ([5, 5, 5], torch.float32),  # no padding at all: sqrt(s) as a constant
        ([6, 3, 5], torch.float32),  # padding: sqrt of each row's real length
        ([5, 5, 5], torch.bfloat16),
        ([6, 3, 5], torch.bfloat16),
    ],
)
def test_training_forward_reads_nothing_and_equals_the_host_decided_path(lengths, dtype):
    model = small_model(dropout=0.0)  # train and eval then differ only in the padding decision
    src, prev = left_padded(lengths), prefixes(len(lengths), 4)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        model.train()
        with HostReads() as reads:
            logits_train, _ = model(src, None, prev)
        model.eval()  # with gradients too: kernels may differ without them (oneDNN on AMD)
        logits_eval, _ = model(src, None, prev)
    assert reads.total == 0, reads.by_name
    assert torch.equal(logits_train.detach(), logits_eval.detach())
    enc = model.train().encoder(src, None)
    has_pad = enc["encoder_has_padding"]
    assert has_pad.dim() == 0 and bool(has_pad) == (len(set(lengths)) > 1)
    assert model.eval().encoder(src, None)["encoder_has_padding"] is None


def test_the_eval_path_still_drops_the_mask_of_an_unpadded_batch():
    model = small_model().eval()
    assert model.encoder(left_padded([4, 4]), None)["encoder_padding_mask"] is None
    assert model.encoder(left_padded([4, 2]), None)["encoder_padding_mask"] is not None
