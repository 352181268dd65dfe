"""Truncated importance sampling in the GRPO loss and the rollout/learner logprob gap, on a hand-computed case."""

from __future__ import annotations

import math

import torch

from polar.algorithms.grpo import grpo_loss


def _case():
    # one sequence, two sampled tokens; learner logprobs differ from the engine's (rollout) ones
    learner = torch.tensor([[0.0, math.log(0.5), math.log(0.2)]], requires_grad=True)
    rollout = torch.tensor([[0.0, math.log(0.25), math.log(0.4)]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    adv = torch.tensor([1.0])
    return learner, rollout, mask, adv


def test_tis_weights_each_token_by_the_capped_ratio():
    learner, rollout, mask, adv = _case()
    # ratios exp(learner - rollout): token 1: 0.5/0.25 = 2.0, token 2: 0.2/0.4 = 0.5; clip 0.2, advantage 1:
    # surrogate -min(r, clip(r)) = -1.2 and -0.5. TIS cap 1.5 weights them by min(2.0, 1.5)=1.5 and 0.5.
    out = grpo_loss(learner, rollout, adv, mask, clip_range=0.2, tis_cap=1.5)
    assert math.isclose(out.loss.item(), (-1.2 * 1.5 + -0.5 * 0.5) / 2, rel_tol=1e-5)
    assert math.isclose(out.tis_weight_mean, (1.5 + 0.5) / 2, rel_tol=1e-5)
    plain = grpo_loss(learner, rollout, adv, mask, clip_range=0.2)
    assert math.isclose(plain.loss.item(), (-1.2 + -0.5) / 2, rel_tol=1e-5)
    assert plain.tis_weight_mean == 1.0
    # the weight is a constant: token 2's gradient (unclipped, d(-r)/dlogp = -r = -0.5) is scaled by 0.5
    out.loss.backward()
    assert math.isclose(learner.grad[0, 2].item(), -0.5 * 0.5 / 2, rel_tol=1e-5)
    assert learner.grad[0, 1].item() == 0.0  # token 1 is clipped (r = 2.0 > 1.2)


def test_logprob_gap_is_reported():
    learner, rollout, mask, adv = _case()
    out = grpo_loss(learner, rollout, adv, mask)
    gaps = [abs(math.log(0.5) - math.log(0.25)), abs(math.log(0.2) - math.log(0.4))]
    assert math.isclose(out.logprob_gap_mean, sum(gaps) / 2, rel_tol=1e-5)
    assert math.isclose(out.logprob_gap_max, max(gaps), rel_tol=1e-5)
