"""Label-smoothed cross entropy: fairseq's formula by hand, plain CE at epsilon 0, pad handling."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from convseq.training.config import CriterionConfig
from convseq.training.criterion import (
    CriterionConfigError,
    LabelSmoothedCrossEntropy,
    label_smoothed_cross_entropy,
    label_smoothed_nll_loss,
    logged_values,
)

PAD = 1


def _batch(seed: int = 0, vocab: int = 7):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, vocab, generator=g)  # (B, T, V)
    target = torch.randint(2, vocab, (3, 5), generator=g)  # (B, T), no pad yet
    target[0, 3:] = PAD
    target[2, 1:] = PAD
    return logits, target


def test_epsilon_zero_is_plain_cross_entropy_exactly():
    logits, target = _batch()
    out = label_smoothed_cross_entropy(logits, target, 0.0, PAD)
    expected = F.cross_entropy(
        logits.view(-1, logits.size(-1)), target.view(-1), ignore_index=PAD, reduction="sum"
    )
    assert torch.equal(out.loss, expected)
    assert torch.equal(out.nll_loss, expected)
    assert out.ntokens.item() == 15 - 2 - 4
    assert out.nsentences == 3


def test_smoothed_loss_on_a_tiny_vocabulary_by_hand():
    # V = 4, pad = 1; probabilities (0.1, 0.2, 0.3, 0.4), target 3, epsilon 0.1:
    # the target weighs 0.9 and each of the 3 other classes (pad included) 0.1 / 3.
    logits = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64).log().view(1, 1, 4)
    target = torch.tensor([[3]])
    out = label_smoothed_cross_entropy(logits, target, 0.1, PAD)
    by_hand = -(0.9 * math.log(0.4) + (0.1 / 3) * (math.log(0.1) + math.log(0.2) + math.log(0.3)))
    assert by_hand == pytest.approx(0.9951948523452089, rel=1e-15)
    assert out.loss.item() == pytest.approx(by_hand, rel=1e-6)
    assert out.nll_loss.item() == pytest.approx(-math.log(0.4), rel=1e-6)
    assert out.ntokens.item() == 1


def test_smoothed_loss_matches_the_weights_form_on_random_batches():
    # Equivalent form: cross entropy against the distribution (1 - eps) on the target and
    # eps / (V - 1) on every other class, summed over non-pad targets.
    logits, target = _batch(seed=3, vocab=9)
    eps = 0.2
    out = label_smoothed_cross_entropy(logits, target, eps, PAD)
    lp = F.log_softmax(logits.double(), dim=-1)
    total = 0.0
    for b in range(target.size(0)):
        for t in range(target.size(1)):
            y = int(target[b, t])
            if y == PAD:
                continue
            for v in range(9):
                w = 1 - eps if v == y else eps / 8
                total -= w * float(lp[b, t, v])
    assert out.loss.item() == pytest.approx(total, rel=1e-6)


def test_pad_targets_contribute_nothing():
    logits, target = _batch(seed=5)
    logits.requires_grad_(True)
    out = label_smoothed_cross_entropy(logits, target, 0.1, PAD)
    out.loss.backward()
    pad = target.eq(PAD)  # (B, T)
    assert torch.all(logits.grad[pad] == 0)
    assert torch.all(logits.grad[~pad].abs().sum(-1) > 0)

    # Changing the scores at pad positions changes nothing; dropping them changes nothing.
    other = logits.detach().clone()
    other[pad] = torch.randn(int(pad.sum()), logits.size(-1)) * 10
    other.requires_grad_(True)  # the same (fused, training) path as `out`
    again = label_smoothed_cross_entropy(other, target, 0.1, PAD)
    assert torch.equal(again.loss, out.loss.detach())
    row = label_smoothed_cross_entropy(logits[2:, :1].detach(), target[2:, :1], 0.1, PAD)
    full_row = label_smoothed_cross_entropy(logits[2:].detach(), target[2:], 0.1, PAD)
    assert torch.allclose(row.loss, full_row.loss, rtol=1e-6, atol=0)
    assert full_row.ntokens.item() == 1


@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_fused_training_path_matches_the_composed_loss_and_gradients(eps):
    # Training (logits that need gradients) takes a fused loss with a hand-written backward;
    # evaluation takes log_softmax + label_smoothed_nll_loss. Both must agree, and so must
    # autograd's gradients of the composed form, for the loss, the nll and any mix of the two.
    logits, target = _batch(seed=7, vocab=11)
    logits = logits * 3  # float32, as the criterion computes
    fused_in = logits.clone().requires_grad_(True)
    fused = label_smoothed_cross_entropy(fused_in, target, eps, PAD)
    (fused.loss + 0.3 * fused.nll_loss).backward()

    ref_in = logits.clone().requires_grad_(True)
    lp = F.log_softmax(ref_in, dim=-1).view(-1, 11)  # the composed form, through autograd
    ref_loss, ref_nll = label_smoothed_nll_loss(lp, target.view(-1), eps, PAD)
    (ref_loss + 0.3 * ref_nll).backward()
    evaluated = label_smoothed_cross_entropy(logits, target, eps, PAD)  # no grad: composed

    assert fused.loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    assert fused.nll_loss.item() == pytest.approx(ref_nll.item(), rel=1e-6)
    assert torch.equal(evaluated.loss, ref_loss.detach())
    torch.testing.assert_close(fused_in.grad, ref_in.grad, rtol=1e-5, atol=1e-6)
    # only the nll used: the smoothing term gets no weight
    only_nll = logits.clone().requires_grad_(True)
    label_smoothed_cross_entropy(only_nll, target, eps, PAD).nll_loss.backward()
    ref_only = logits.clone().requires_grad_(True)
    F.cross_entropy(
        ref_only.view(-1, 11), target.view(-1), ignore_index=PAD, reduction="sum"
    ).backward()
    torch.testing.assert_close(only_nll.grad, ref_only.grad, rtol=1e-5, atol=1e-6)


def test_low_precision_logits_give_a_float32_loss():
    logits, target = _batch(seed=1)
    out = label_smoothed_cross_entropy(logits.to(torch.bfloat16), target, 0.1, PAD)
    ref = label_smoothed_cross_entropy(logits.to(torch.bfloat16).float(), target, 0.1, PAD)
    assert out.loss.dtype == torch.float32
    assert torch.equal(out.loss, ref.loss)


def test_logged_values_are_base_2_per_token():
    # 10 tokens with 3 bits each; smoothed loss 4 bits per token, or per sentence over 2.
    out = logged_values(10 * 4 * math.log(2), 10 * 3 * math.log(2), torch.tensor(10))
    assert out["loss"] == pytest.approx(4.0, rel=1e-12)
    assert out["nll_loss"] == pytest.approx(3.0, rel=1e-12)
    assert out["ppl"] == pytest.approx(8.0, rel=1e-12)
    per_sentence = logged_values(10 * 4 * math.log(2), 10 * 3 * math.log(2), 10, sample_size=2)
    assert per_sentence["loss"] == pytest.approx(20.0, rel=1e-12)
    assert per_sentence["nll_loss"] == pytest.approx(3.0, rel=1e-12)
    assert logged_values(1e6, 1e6, 1)["ppl"] == math.inf
    assert math.isnan(logged_values(0.0, 0.0, 0)["loss"])


def test_criterion_from_config_and_sample_size():
    logits, target = _batch()
    crit = LabelSmoothedCrossEntropy.from_config(
        CriterionConfig(label_smoothing=0.1), padding_idx=PAD
    )
    out = crit(logits, target)
    assert crit.sample_size(out) is out.ntokens
    assert torch.equal(out.loss, label_smoothed_cross_entropy(logits, target, 0.1, PAD).loss)
    crit = LabelSmoothedCrossEntropy(0.0, PAD, normalize="sentences")
    assert crit.sample_size(crit(logits, target)) == 3


def test_config_errors_name_the_key():
    with pytest.raises(CriterionConfigError, match="criterion.label_smoothing"):
        LabelSmoothedCrossEntropy(1.0, PAD)
    with pytest.raises(CriterionConfigError, match="criterion.normalize='words'"):
        LabelSmoothedCrossEntropy(0.1, PAD, normalize="words")
