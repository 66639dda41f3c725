"""Parameters that get no gradient, found before DDP wraps the model.

PyTorch's DDP expects a gradient for every parameter that requires one: with a parameter the
model never uses (`model.decoder_attention=false` leaves the encoder's output unused, so all of
the encoder's parameters), its reducer waits for a gradient that never comes and fails at the
next step, unless it was built with `find_unused_parameters=True`, which costs a walk over the
autograd graph at every step. convseq asks the model itself, once, at setup: one forward and
backward pass of a 1-sentence batch in eval mode (no dropout, so the random stream is not
touched), and turns the walk on only where some parameter got no gradient.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["unused_parameters"]


def _probe_batch(model: nn.Module, device: torch.device) -> dict[str, torch.Tensor] | None:
    """A 1-sentence, 4-token batch of the model's last symbols (no padding), or None for a
    model without encoder and decoder token embeddings (both families have them)."""
    try:
        src_size = model.encoder.embed_tokens.num_embeddings
        tgt_size = model.decoder.embed_tokens.num_embeddings
    except AttributeError:
        return None
    return {
        "src_tokens": torch.full((1, 4), src_size - 1, dtype=torch.long, device=device),  # (1, 4)
        "src_lengths": torch.full((1,), 4, dtype=torch.long, device=device),  # (1,)
        "prev_output_tokens": torch.full((1, 4), tgt_size - 1, dtype=torch.long, device=device),
    }


def unused_parameters(model: nn.Module) -> list[str] | None:
    """Names of `model`'s trainable parameters that one training pass leaves without a
    gradient; None where the model cannot be probed (neither an fconv nor a LightConv-like
    model: no ``encoder.embed_tokens`` / ``decoder.embed_tokens``)."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        return []
    batch = _probe_batch(model, trainable[0][1].device)
    if batch is None:
        return None
    saved = [p.grad for _, p in trainable]
    was_training = model.training
    for _, p in trainable:
        p.grad = None
    try:
        model.eval()
        with torch.enable_grad():
            logits = model(**batch)[0]  # (1, 4, V)
            logits.float().sum().backward()
        return [n for n, p in trainable if p.grad is None]
    finally:
        model.train(was_training)
        for (_, p), grad in zip(trainable, saved):
            p.grad = grad
