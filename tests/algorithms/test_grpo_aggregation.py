"""The GRPO loss's aggregation options against a hand computation: token mean (today's), Dr.GRPO's sequence
sum over the sequences, GSPO's sequence-level ratio; and Dr.GRPO's advantage without the std."""

import math

import pytest
import torch

from polar.algorithms.grpo import group_advantages, grpo_loss

# two sequences: the first trains 3 tokens, the second 1 (position 0 is the prompt)
MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
OLD = torch.tensor([[0.0, -1.0, -2.0, -0.5], [0.0, -1.5, 0.0, 0.0]])
DELTA = torch.tensor([[0.0, 0.1, -0.05, 0.3], [0.0, -0.4, 0.0, 0.0]])  # new - old logprob per token
ADV = torch.tensor([1.0, -2.0])


def _surrogate(ratio: float, adv: float, eps: float = 0.2) -> float:
    return -min(ratio * adv, min(max(ratio, 1 - eps), 1 + eps) * adv)


def test_token_mean_divides_by_the_tokens():
    out = grpo_loss(OLD + DELTA, OLD, ADV, MASK, aggregation="token_mean")
    per_token = [_surrogate(math.exp(0.1), 1.0), _surrogate(math.exp(-0.05), 1.0), _surrogate(math.exp(0.3), 1.0),
                 _surrogate(math.exp(-0.4), -2.0)]
    assert out.loss.item() == pytest.approx(sum(per_token) / 4, rel=1e-5)


def test_dr_grpo_sums_each_sequence_and_divides_by_the_sequences():
    out = grpo_loss(OLD + DELTA, OLD, ADV, MASK, aggregation="dr_grpo")
    seq1 = _surrogate(math.exp(0.1), 1.0) + _surrogate(math.exp(-0.05), 1.0) + _surrogate(math.exp(0.3), 1.0)
    seq2 = _surrogate(math.exp(-0.4), -2.0)
    assert out.loss.item() == pytest.approx((seq1 + seq2) / 2, rel=1e-5)
    # a given normalizer (the mini-batch's sequences, under gradient accumulation) replaces B
    assert grpo_loss(OLD + DELTA, OLD, ADV, MASK, normalizer=5.0, aggregation="dr_grpo").loss.item() == \
        pytest.approx((seq1 + seq2) / 5, rel=1e-5)


def test_gspo_clips_one_ratio_per_sequence():
    out = grpo_loss(OLD + DELTA, OLD, ADV, MASK, aggregation="gspo")
    r1 = math.exp((0.1 - 0.05 + 0.3) / 3)  # the geometric mean of the sequence's token ratios
    r2 = math.exp(-0.4)
    expected = (_surrogate(r1, 1.0) + _surrogate(r2, -2.0)) / 2
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)
    assert out.ratio_mean == pytest.approx((r1 + r2) / 2, rel=1e-5)
    assert out.clip_fraction == pytest.approx(0.5)  # r2 = 0.67 is outside [0.8, 1.2], r1 = 1.12 is not
    # the gradient reaches every token of a sequence whose ratio is inside the clip, each by 1/len of it
    logp = (OLD + DELTA).clone().requires_grad_(True)
    grpo_loss(logp, OLD, ADV, MASK, aggregation="gspo").loss.backward()
    g = logp.grad
    assert g is not None
    assert torch.allclose(g[0, 1:], torch.full((3,), -r1 * 1.0 / 3 / 2), atol=1e-6)
    assert float(g[1].abs().sum()) == 0.0  # clipped (ratio below 1 - eps with a negative advantage): no gradient


def test_gspo_refuses_per_token_advantages():
    with pytest.raises(ValueError, match="one advantage per sequence"):
        grpo_loss(OLD, OLD, torch.zeros_like(OLD), MASK, aggregation="gspo")


def test_dr_grpo_advantage_has_no_std():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert group_advantages(r, "mean").tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert group_advantages(r, "mean_std").tolist()[0] == pytest.approx(0.75 / math.sqrt(0.1875), rel=1e-4)
