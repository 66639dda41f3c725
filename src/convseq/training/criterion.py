"""Label-smoothed cross entropy as fairseq defines it, summed over non-pad target tokens.

With epsilon the smoothing, V the vocabulary size and ``eps_i = epsilon / (V - 1)``, each non-pad
target y with log-probabilities lp contributes::

    nll    = -lp[y]
    smooth = -sum_v lp[v]                  (the whole vocabulary, pad included)
    loss   = (1 - epsilon - eps_i) * nll + eps_i * smooth

i.e. the target gets weight 1 - epsilon and every other class epsilon / (V - 1). Pad targets
contribute nothing. epsilon 0 is plain cross entropy. Losses are sums (natural log); the trainer
divides gradients by the sample size (target tokens, or sentences), and `logged_values` turns
sums into fairseq's logged figures (base 2 per token, perplexity 2 ** nll_loss).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from convseq.errors import ConvseqError
from convseq.training.config import CriterionConfig

NORMALIZE = ("tokens", "sentences")


class CriterionConfigError(ConvseqError, ValueError):
    """The criterion configuration holds a bad value."""


class CriterionOutput(NamedTuple):
    """Sums over one batch (0-dim float32 tensors), and its sizes."""

    loss: torch.Tensor  # label-smoothed loss, summed over non-pad targets (natural log)
    nll_loss: torch.Tensor  # -log p(target), summed over non-pad targets
    ntokens: torch.Tensor  # 0-dim int64: non-pad targets (a tensor: no host sync on GPU)
    nsentences: int  # rows of the target


def label_smoothed_nll_loss(
    lprobs: torch.Tensor, target: torch.Tensor, epsilon: float, padding_idx: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed smoothed loss and summed nll from log-probabilities.

    Args:
        lprobs: (N, V) log-probabilities.
        target: (N,) target indices; entries equal to ``padding_idx`` are ignored.
        epsilon: label smoothing in [0, 1).
        padding_idx: the pad symbol.

    Returns:
        (loss, nll_loss), both 0-dim sums.
    """
    # The same kernel as F.cross_entropy(reduction="sum", ignore_index=pad), so epsilon 0
    # reproduces plain cross entropy bit for bit.
    nll = F.nll_loss(lprobs, target, ignore_index=padding_idx, reduction="sum")
    if epsilon == 0.0:
        return nll, nll  # skips a full (N, V) reduction
    vocab = lprobs.size(-1)
    eps_i = epsilon / (vocab - 1)
    pad_mask = target.eq(padding_idx)  # (N,)
    smooth = -lprobs.sum(dim=-1).masked_fill(pad_mask, 0.0).sum()  # (N,) -> ()
    loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
    return loss, nll


class _FusedSmoothedCE(torch.autograd.Function):
    """`label_smoothed_nll_loss(log_softmax(logits))` with a hand-written backward.

    Why: the (N, V) logits dominate memory traffic on CPU. Through autograd, the composed loss
    makes about eight passes over an (N, V) tensor in its backward (a zero-filled gather
    gradient, the sum's expanded gradient added to it, then log_softmax's backward); this one
    makes four. With lse the row's logsumexp and p = exp(logits - lse), a non-pad row's loss
    a' * (lse - x_y) + eps_i * (V * lse - sum_v x_v) has the gradient
    (a' + V * eps_i) * p - eps_i - a' * onehot(y), where a' = 1 - epsilon - eps_i.
    """

    @staticmethod
    def forward(ctx, logits, target, epsilon, padding_idx):  # noqa: D102
        vocab = logits.size(-1)
        eps_i = epsilon / (vocab - 1)
        keep = target.ne(padding_idx).to(logits.dtype)  # (N,) 1 for real targets
        lse = torch.logsumexp(logits, dim=-1)  # (N,)
        picked = logits.gather(1, target.unsqueeze(1)).squeeze(1)  # (N,) x_y
        nll = ((lse - picked) * keep).sum()
        smooth = ((lse * vocab - logits.sum(dim=-1)) * keep).sum()  # sum_v -lp[v] per row
        loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
        ctx.save_for_backward(logits, target, lse, keep)
        ctx.coefs = (1.0 - epsilon - eps_i, eps_i)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):  # noqa: D102
        logits, target, lse, keep = ctx.saved_tensors
        w_nll, eps_i = ctx.coefs
        vocab = logits.size(-1)
        zero = logits.new_zeros(())
        g_loss = zero if grad_loss is None else grad_loss
        g_nll = zero if grad_nll is None else grad_nll
        a = w_nll * g_loss + g_nll  # weight of each row's nll term
        b = eps_i * g_loss  # weight of each row's smoothing term
        grad = torch.sub(logits, lse.unsqueeze(1)).exp_()  # (N, V) softmax
        grad.mul_(((a + vocab * b) * keep).unsqueeze(1)).sub_((b * keep).unsqueeze(1))
        grad.scatter_add_(1, target.unsqueeze(1), (-a * keep).unsqueeze(1))  # - a * onehot(y)
        return grad, None, None, None


def label_smoothed_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, padding_idx: int
) -> CriterionOutput:
    """The summed label-smoothed cross entropy of a batch of decoder outputs.

    Args:
        logits: (B, T, V) unnormalised scores (any float dtype; the loss is computed in float32).
        target: (B, T) target indices, ``padding_idx`` where there is no token.
        epsilon: label smoothing in [0, 1); 0 is plain cross entropy.
        padding_idx: the pad symbol.
    """
    vocab = logits.size(-1)
    if epsilon > 0.0 and vocab < 2:
        raise ValueError(f"label smoothing needs a vocabulary of at least 2 symbols, got {vocab}")
    flat_target = target.reshape(-1)  # (B*T,)
    # float32 even under bf16/fp16 autocast: the loss sums thousands of terms.
    flat_logits = logits.float().reshape(-1, vocab)  # (B*T, V)
    if epsilon > 0.0 and flat_logits.requires_grad:
        loss, nll = _FusedSmoothedCE.apply(flat_logits, flat_target, epsilon, padding_idx)
    else:
        lprobs = F.log_softmax(flat_logits, dim=-1)  # (B*T, V)
        loss, nll = label_smoothed_nll_loss(lprobs, flat_target, epsilon, padding_idx)
    ntokens = flat_target.ne(padding_idx).sum()
    return CriterionOutput(loss, nll, ntokens, int(target.size(0)))


class LabelSmoothedCrossEntropy:
    """The training criterion configured by the `criterion` group.

    Args:
        label_smoothing: epsilon in [0, 1).
        padding_idx: the pad symbol of the target dictionary.
        normalize: ``tokens`` (fairseq) or ``sentences`` (fairseq's --sentence-avg): what the
            summed loss is divided by for the gradient (see `sample_size`).
    """

    def __init__(self, label_smoothing: float, padding_idx: int, normalize: str = "tokens"):
        if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
            raise CriterionConfigError(
                f"criterion.label_smoothing must be a number, got {label_smoothing!r}"
            )
        if not 0.0 <= label_smoothing < 1.0:
            raise CriterionConfigError(
                f"criterion.label_smoothing must lie in [0, 1), got {label_smoothing!r} "
                "(fairseq's recipes use 0.1)"
            )
        if normalize not in NORMALIZE:
            raise CriterionConfigError(
                f"criterion.normalize={normalize!r}; choose one of {', '.join(NORMALIZE)}"
            )
        self.epsilon = float(label_smoothing)
        self.padding_idx = int(padding_idx)
        self.normalize = normalize

    @classmethod
    def from_config(cls, cfg: CriterionConfig, padding_idx: int) -> LabelSmoothedCrossEntropy:
        """Build from the `criterion` config."""
        return cls(cfg.label_smoothing, padding_idx, cfg.normalize)

    def __call__(self, logits: torch.Tensor, target: torch.Tensor) -> CriterionOutput:
        """Sums over the batch: logits (B, T, V), target (B, T)."""
        return label_smoothed_cross_entropy(logits, target, self.epsilon, self.padding_idx)

    def sample_size(self, out: CriterionOutput) -> torch.Tensor | int:
        """What gradients are divided by: the batch's target tokens or its sentences."""
        return out.ntokens if self.normalize == "tokens" else out.nsentences


def _scalar(value: torch.Tensor | float | int) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def logged_values(
    loss_sum: torch.Tensor | float,
    nll_sum: torch.Tensor | float,
    ntokens: torch.Tensor | int,
    sample_size: torch.Tensor | int | None = None,
) -> dict[str, float]:
    """fairseq's logged figures from summed losses (possibly summed over batches and ranks).

    Args:
        loss_sum: summed label-smoothed loss (natural log).
        nll_sum: summed nll (natural log).
        ntokens: non-pad target tokens behind the sums.
        sample_size: what the loss is averaged over (default: ntokens; sentences with
            ``normalize=sentences``).

    Returns:
        ``loss`` = loss_sum / sample_size / ln 2 and ``nll_loss`` = nll_sum / ntokens / ln 2
        (bits per token), ``ppl`` = 2 ** nll_loss (inf on overflow). NaN where a count is 0.
    """
    loss_sum, nll_sum = _scalar(loss_sum), _scalar(nll_sum)
    tokens = _scalar(ntokens)
    size = tokens if sample_size is None else _scalar(sample_size)
    loss = loss_sum / size / math.log(2) if size > 0 else math.nan
    nll = nll_sum / tokens / math.log(2) if tokens > 0 else math.nan
    try:
        ppl = 2.0**nll
    except OverflowError:
        ppl = math.inf
    return {"loss": loss, "nll_loss": nll, "ppl": ppl}
