"""Agent runs on Ray: the rollout stack whose gateway nodes (each with its engine) are Ray actors.

Sessions spread over two nodes on a two-node ``ray.cluster_utils.Cluster``; a weight sync reaches every
node and later records carry its version; a killed node is replaced by the watchdog, and the replacement
serves the synced weights (not its engine's initial ones) from its first call. Also: the ``distribution``
keys an agent run cannot honour are named at start."""

import time
from pathlib import Path

import pytest
import torch

AGENTIC_TESTS = Path(__file__).resolve().parents[1] / "agent_support"


def scripted_tiny_factory():
    """Built inside each gateway actor: a scripted reply with real tiny-model logprobs (seed 0 weights)."""
    from polar.inference import ScriptedEngine

    return ScriptedEngine.tiny(lambda req, i: "hello", model_name="tiny")


def wait_for(pred, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.mark.ray
@pytest.mark.slow
def test_ray_session_stack_spreads_sessions_syncs_every_node_and_replaces_a_lost_one(ray_cluster, tmp_path):
    import ray

    from polar.harness.agent.runners import CallableRunner
    from polar.harness.agent.verifiers import UserFunction
    from polar.inference import ScriptedEngine
    from polar.rollout.sessions.pipeline import PipelineSettings
    from polar.rollout.sessions.ray_nodes import RaySessionStack

    runner = CallableRunner("agents_for_tests:one_token", AGENTIC_TESTS)
    verifier = UserFunction("agents_for_tests:even_token", AGENTIC_TESTS)
    settings = PipelineSettings(agent_timeout_s=120, workspace_root=str(tmp_path / "ws"), max_run_workers=4,
                                max_node_retries=2, node_wait_s=60)
    learner_engine = ScriptedEngine.tiny(lambda req, i: "hello", model_name="tiny")
    groups = [({"id": f"t{i}", "prompt": f"Say hello {i}."}, 4, {"group_id": f"g{i}"}) for i in range(2)]
    with RaySessionStack(learner_engine, scripted_tiny_factory, runner, verifier, settings, num_nodes=2,
                         num_cpus=0.5, heartbeat_timeout_s=4.0, check_interval_s=1.0) as stack:
        assert len({d["ray_node_id"] for d in stack.nodes.describe()}) == 2  # one gateway per Ray node
        wait_for(lambda: len(stack.rollout.registry.nodes) == 2, 60, "gateway actors did not register")
        results = [r for g in stack.run_groups(groups, timeout_s=300) for r in g]
        assert len(results) == 8 and all(r.samples for r in results), [r.error for r in results]
        assert {r.node_id for r in results} == set(stack.nodes.actors)  # both nodes served sessions
        assert {s.metadata["min_policy_version"] for r in results for s in r.samples} == {0}

        model = learner_engine.model
        new = {k: v + 0.5 * torch.randn_like(v) for k, v in model.state_dict().items() if k == "lm_head.weight"}
        status = stack.update_weights(new, 1)
        assert status["policy_version"] == 1 and status["lost_during_sync"] == []
        assert ray.get([a.policy_version.remote() for a in stack.nodes.actors.values()]) == [1, 1]
        results = [r for g in stack.run_groups(groups, timeout_s=300) for r in g]
        assert {s.metadata["min_policy_version"] for r in results for s in r.samples} == {1}

        victim = sorted(stack.nodes.actors)[0]
        stack.nodes.kill(victim)
        wait_for(lambda: stack.nodes.restarts == 1 and victim not in stack.rollout.registry.nodes, 120,
                 "the watchdog did not replace the killed node")
        wait_for(lambda: len(stack.rollout.registry.nodes) == 2, 240, "the replacement did not register")
        # the replacement took the synced weights before it registered
        assert ray.get([a.policy_version.remote() for a in stack.nodes.actors.values()]) == [1, 1]
        results = [r for g in stack.run_groups(groups, timeout_s=300) for r in g]
        assert len(results) == 8 and victim not in {r.node_id for r in results}
        assert {s.metadata["min_policy_version"] for r in results for s in r.samples} == {1}


def test_distribution_settings_an_agent_run_cannot_honour_are_named():
    from polar.config.sections import DistributionConfig
    from polar.rollout.sessions.ray_nodes import agent_distribution_problems

    assert agent_distribution_problems(DistributionConfig()) == []
    assert agent_distribution_problems(DistributionConfig(backend="ray", rollout_workers=2,
                                                          gateway_resources={"num_cpus": 2})) == []
    local = agent_distribution_problems(DistributionConfig(rollout_workers=4))
    assert local == ["distribution.rollout_workers is set (4) but an agent run cannot honour it: agent runs with "
                     "backend: local run one in-process gateway and engine; remove it, or set backend: ray"]
    ray_probs = agent_distribution_problems(DistributionConfig(backend="ray", envs_per_worker=4,
                                                               learner_resources={"num_cpus": 4}))
    assert [p.split(" is set")[0] for p in ray_probs] == ["distribution.envs_per_worker",
                                                          "distribution.learner_resources"]
    # a learner placed as a Ray actor honours learner_resources
    assert agent_distribution_problems(DistributionConfig(backend="ray", learner_resources={"num_cpus": 4}),
                                       learner_actor=True) == []
