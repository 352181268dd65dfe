"""prefix_merging and per_request trajectories of the same sessions train to the same loss."""

import copy

import pytest
import torch

from polar.algorithms.grpo import GRPOLearner
from polar.config.grpo import GRPOKwargs
from polar.harness.agent.runners import CallableRunner
from polar.harness.agent.verifiers import NoVerifier
from polar.inference import ScriptedEngine
from polar.models.llm_policy import LLMPolicy
from polar.rollout.sessions.local import LocalStack
from polar.rollout.sessions.pipeline import PipelineSettings
from polar.trajectory import build
from tests.agent_support.helpers import EXAMPLES


@pytest.fixture(scope="module")
def session_records(tmp_path_factory):
    engine = ScriptedEngine.tiny(lambda req, i: f"note {i % 5} kept.")
    runner = CallableRunner("multi_turn_agent:agent", EXAMPLES)
    # one session at a time, so which session gets which scripted replies does not depend on scheduling
    settings = PipelineSettings(workspace_root=str(tmp_path_factory.mktemp("ws")), max_init_workers=1,
                                max_run_workers=1)
    with LocalStack(engine, runner, NoVerifier(), settings) as stack:
        groups = stack.run_groups([({"prompt": "Take a note.", "turns": 4}, 3, {})], timeout_s=600)
        records = {r.session_id: stack.gateway.records(r.session_id) for r in groups[0]}
    return engine, records


@pytest.mark.parametrize("rewarded", [0, 1, 2])
def test_builders_train_to_the_same_loss(session_records, rewarded):
    engine, records = session_records
    advantages = [1.0 if i == rewarded else -0.5 for i in range(len(records))]
    advantage = dict(zip(records, advantages, strict=True))

    losses = {}
    counts = {}
    for builder in ("per_request", "prefix_merging"):
        samples = []
        for recs in records.values():
            samples += build(recs, builder)[0]
        counts[builder] = len(samples)
        advs = [advantage[s.session_id] for s in samples]
        policy = LLMPolicy(copy.deepcopy(engine.model), engine.tokenizer)
        torch.manual_seed(0)
        learner = GRPOLearner(policy, GRPOKwargs(learning_rate=3e-5, micro_batch_size=2, group_size=3))
        losses[builder] = [learner.optimize(samples, advs)["policy_loss"] for _ in range(3)]
    assert counts == {"per_request": 12, "prefix_merging": 3}
    # same tokens, same contexts, same token-level normalization: the same loss at every step
    for a, b in zip(losses["per_request"], losses["prefix_merging"], strict=True):
        assert abs(a - b) < 1e-6, losses
    # and every step lowers it (a learning rate small enough that Adam's first sign-like step does not overshoot)
    assert losses["prefix_merging"][2] < losses["prefix_merging"][1] < losses["prefix_merging"][0], losses
