"""Every GRPO update reports the rollout/learner logprob gap (and the TIS weight) among its stats."""

from __future__ import annotations

import math

import torch

from polar.algorithms.grpo import GRPOLearner
from polar.config.grpo import GRPOKwargs
from polar.models.llm_policy import LLMPolicy
from polar.types import TrajectorySample


def _sample(ids, logprobs):
    n = len(ids)
    return TrajectorySample(token_ids=ids, loss_mask=[0, 0, 1, 1, 1], logprobs=logprobs, session_id="s",
                            policy_versions=[0] * n, call_indices=[0] * n)


def test_update_reports_the_gap_against_recorded_logprobs():
    from polar.algorithms.grpo import token_logprobs
    from polar.inference.tiny import build_tiny
    from polar.models.llm_policy import collate

    model, tok = build_tiny(0)
    policy = LLMPolicy(model, tok)
    ids = [5, 9, 11, 13, 17]
    batch = collate([_sample(ids, [0.0] * 5)], policy.pad_id)
    with torch.no_grad():
        true_lp = token_logprobs(policy.logits(batch), batch.token_ids)[0].tolist()
    shift = 0.3  # the engine recorded every sampled token 0.3 nats more likely than the learner computes
    rec = [0.0, 0.0] + [lp + shift for lp in true_lp[2:]]
    samples = [_sample(ids, rec)] * 2
    learner = GRPOLearner(policy, GRPOKwargs(micro_batch_size=1, tis_cap=2.0, learning_rate=1e-5))
    stats = learner.optimize(samples, [1.0, -1.0])
    assert math.isclose(stats["logprob_gap_mean"], shift, rel_tol=1e-3)
    assert math.isclose(stats["logprob_gap_max"], shift, rel_tol=1e-3)
    assert math.isclose(stats["tis_weight_mean"], math.exp(-shift), rel_tol=1e-3)
