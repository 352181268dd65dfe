"""The agentic example with its sessions spread over two gateway nodes that are Ray actors.

The calculator agent (examples/agentic, official openai SDK) runs against whichever node the rollout
service picks; the nodes register and heartbeat over HTTP from their actors. Killing one node: new
sessions go to the other, and the node is replaced.
"""

import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # ~90 s: builds the tiny model in each gateway actor

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agentic"


def oracle_engine_factory():
    """Built inside each gateway actor: the agentic tests' scripted 'model' (real tokenizer and logprobs)."""
    from polar.inference import ScriptedEngine
    from polar.inference.tiny import build_tiny_tokenizer
    from tests.agentic.helpers import oracle_script

    return ScriptedEngine.tiny(oracle_script(build_tiny_tokenizer()))


def group(i, n):
    from tests.agentic.helpers import calc_tasks

    return (calc_tasks(i + 1)[i], n, {"group_id": f"g{i}", "policy_version": 0})


def wait_for(pred, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_sessions_spread_over_two_gateway_actors_and_survive_losing_one(ray_cluster, tmp_path):
    from polar.agentic.local import RolloutServer
    from polar.agentic.pipeline import PipelineSettings
    from polar.agentic.runners import CallableRunner
    from polar.agentic.verifiers import UserFunction
    from polar.distributed.gateway_actor import RayGatewayNodes

    runner = CallableRunner("calculator_agent:agent", EXAMPLES)
    settings = PipelineSettings(agent_timeout_s=120, workspace_root=str(tmp_path / "ws"), max_run_workers=4,
                                model_name="tiny")
    verifier = UserFunction("verifier:verify", EXAMPLES)
    with RolloutServer(runner, verifier, settings, heartbeat_timeout_s=3.0) as server:
        # harnesses may hard-code a model name; the test engine serves "tiny" under any name
        nodes = RayGatewayNodes(2, server.url, oracle_engine_factory, num_cpus=0.5, heartbeat_interval_s=0.5,
                                gateway_cfg={"accept_any_model": True})
        try:
            ray_nodes = {d["ray_node_id"] for d in nodes.describe()}
            assert len(ray_nodes) == 2  # SPREAD: one gateway per Ray node
            wait_for(lambda: len(server.registry.nodes) == 2, 60, "gateway actors did not register")

            results = [r for g in server.run_groups([group(0, 4), group(1, 4)], timeout_s=300) for r in g]
            assert [r.reward for r in results] == [1.0] * 8, [(r.status, r.output) for r in results][:2]
            assert {r.node_id for r in results} == set(nodes.actors)  # both nodes served sessions
            assert all(r.samples and sum(r.samples[0].loss_mask) > 0 for r in results)

            victim = sorted(nodes.actors)[0]
            nodes.kill(victim)
            victim_node = server.registry.nodes[victim]
            wait_for(lambda: not server.registry.healthy(victim_node), 30, "dead node still looks healthy")
            results = [r for g in server.run_groups([group(2, 4)], timeout_s=300) for r in g]
            assert [r.reward for r in results] == [1.0] * 4
            assert {r.node_id for r in results} == set(nodes.actors) - {victim}

            replacement = nodes.check()
            assert len(replacement) == 1 and nodes.restarts == 1
            wait_for(lambda: replacement[0] in server.registry.nodes, 60, "replacement did not register")
            results = [r for g in server.run_groups([group(3, 4)], timeout_s=300) for r in g]
            assert [r.reward for r in results] == [1.0] * 4
            assert replacement[0] in {r.node_id for r in results}
        finally:
            nodes.close()
