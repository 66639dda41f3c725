"""The part fconv's encoder and decoder build alike: embeddings, fc1, the residual conv stack."""

from __future__ import annotations

import torch
from torch import nn

from convseq.models.stack import conv_stack


def test_conv_stack_projects_residuals_whose_channels_differ():
    made = []

    def conv(c_in, c_out, k):
        made.append(("conv", c_in, c_out, k))
        return nn.Conv1d(c_in, 2 * c_out, k)

    def extra(i, c_out):
        made.append(("extra", i, c_out))
        return nn.Linear(c_out, 1) if i % 2 else None

    specs = [(8, 3, 1), (8, 3, 1), (16, 5, 1), (16, 3, 2), (16, 3, 0)]
    stack = conv_stack(30, 12, 64, 1, specs, 0.1, conv, extra)
    assert stack.embed_tokens.num_embeddings == 30 and stack.embed_tokens.padding_idx == 1
    assert stack.fc1.in_features == 12 and stack.fc1.out_features == 8
    projections = [
        None if p is None else (p.in_features, p.out_features) for p in stack.projections
    ]
    assert projections == [None, None, (8, 16), (8, 16), None]  # residual 2 reaches back to 8
    assert made == [  # layer by layer: its convolution, then its extra module
        ("conv", 8, 8, 3), ("extra", 0, 8),
        ("conv", 8, 8, 3), ("extra", 1, 8),
        ("conv", 8, 16, 5), ("extra", 2, 16),
        ("conv", 16, 16, 3), ("extra", 3, 16),
        ("conv", 16, 16, 3), ("extra", 4, 16),
    ]  # fmt: skip
    assert [e is None for e in stack.extras] == [True, False, True, False, True]
    assert stack.residuals == [1, 1, 1, 2, 0] and stack.out_channels == 16


def test_conv_stack_creates_its_modules_in_layer_order():
    """A seed gives the same weights whether a layer's modules are made here or by hand."""
    specs = [(8, 3, 1), (16, 3, 1)]
    torch.manual_seed(3)
    stack = conv_stack(20, 8, 32, 1, specs, 0.0, lambda i, o, k: nn.Linear(i, o))
    torch.manual_seed(3)
    by_hand = conv_stack(20, 8, 32, 1, specs[:1], 0.0, lambda i, o, k: nn.Linear(i, o))
    assert torch.equal(stack.embed_tokens.weight, by_hand.embed_tokens.weight)
    assert torch.equal(stack.convolutions[0].weight, by_hand.convolutions[0].weight)
