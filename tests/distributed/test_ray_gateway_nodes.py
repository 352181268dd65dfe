"""The agentic example with its sessions spread over two gateway nodes that are Ray actors.

The calculator agent (examples/agentic, official openai SDK) runs against whichever node the rollout
service picks; the nodes register and heartbeat over HTTP from their actors. Killing one node while
sessions are in flight on it: those sessions are re-dispatched to the other node and finish there, new
sessions go to the other node, and the node is replaced.
"""

import concurrent.futures
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # ~90 s: builds the tiny model in each gateway actor

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agentic"
AGENTIC_TESTS = Path(__file__).resolve().parents[1] / "agent_support"


def oracle_engine_factory():
    """Built inside each gateway actor: the agentic tests' scripted 'model' (real tokenizer and logprobs)."""
    from polar.inference import ScriptedEngine
    from polar.inference.tiny import build_tiny_tokenizer
    from tests.agent_support.helpers import oracle_script

    return ScriptedEngine.tiny(oracle_script(build_tiny_tokenizer()))


def group(i, n):
    from tests.agent_support.helpers import calc_tasks

    return (calc_tasks(i + 1)[i], n, {"group_id": f"g{i}", "policy_version": 0})


def wait_for(pred, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_sessions_spread_over_two_gateway_actors_and_survive_losing_one(ray_cluster, tmp_path):
    import httpx

    from polar.harness.agent.runners import CallableRunner
    from polar.harness.agent.verifiers import UserFunction
    from polar.rollout.sessions.local import RolloutServer
    from polar.rollout.sessions.pipeline import PipelineSettings
    from polar.rollout.sessions.ray_nodes import RayGatewayNodes
    from polar.rollout.sessions.session import SessionStatus

    # the calculator example agent; on the node named in a task's ``stall_on`` it stalls after one call
    runner = CallableRunner("agents_for_tests:calc_or_stall", AGENTIC_TESTS)
    settings = PipelineSettings(agent_timeout_s=120, workspace_root=str(tmp_path / "ws"), max_run_workers=4,
                                model_name="tiny", max_node_retries=2, node_wait_s=30)
    verifier = UserFunction("verifier:verify", EXAMPLES)
    markers = tmp_path / "markers"
    markers.mkdir()
    with RolloutServer(runner, verifier, settings, heartbeat_timeout_s=3.0) as server, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        # harnesses may hard-code a model name; the test engine serves "tiny" under any name
        nodes = RayGatewayNodes(2, server.url, oracle_engine_factory, num_cpus=0.5, heartbeat_interval_s=0.5,
                                gateway_cfg={"accept_any_model": True}, service_token=server.token)
        try:
            ray_nodes = {d["ray_node_id"] for d in nodes.describe()}
            assert len(ray_nodes) == 2  # SPREAD: one gateway per Ray node
            wait_for(lambda: len(server.registry.nodes) == 2, 60, "gateway actors did not register")

            results = [r for g in server.run_groups([group(0, 4), group(1, 4)], timeout_s=300) for r in g]
            assert [r.reward for r in results] == [1.0] * 8, [(r.status, r.output) for r in results][:2]
            assert {r.node_id for r in results} == set(nodes.actors)  # both nodes served sessions
            assert all(r.samples and sum(r.samples[0].loss_mask) > 0 for r in results)

            # kill a node while two sessions are mid-RUN on it: they are re-dispatched to the survivor
            victim = sorted(nodes.actors)[0]
            victim_node = server.registry.nodes[victim]
            stalling = [(dict(t, stall_on=victim_node.url, marker_dir=str(markers)), n, m)
                        for t, n, m in (group(4, 2), group(5, 2))]
            job = pool.submit(server.run_groups, stalling, 300)
            wait_for(lambda: len(list(markers.iterdir())) == 2, 120, "sessions did not reach RUN on the victim")
            stalled = sorted(p.name for p in markers.iterdir())
            nodes.kill(victim)
            results = [r for g in job.result(timeout=300) for r in g]
            assert [(r.status, r.reward) for r in results] == [(SessionStatus.DONE, 1.0)] * 4, [r.error for r in results]
            assert {r.node_id for r in results} == set(nodes.actors) - {victim}
            assert sorted(r.session_id for r in results if r.redispatched) == stalled
            assert all(r.attempts == 2 and r.lost_nodes[0]["node_id"] == victim for r in results if r.redispatched)
            health = httpx.get(f"{server.url}/health", timeout=10).json()
            assert health["sessions_redispatched"] == 2 and health["sessions_node_lost"] == 0
            assert not server.registry.healthy(victim_node)

            results = [r for g in server.run_groups([group(2, 4)], timeout_s=300) for r in g]
            assert [r.reward for r in results] == [1.0] * 4
            assert {r.node_id for r in results} == set(nodes.actors) - {victim}

            replacement = nodes.check()
            assert len(replacement) == 1 and nodes.restarts == 1
            assert victim not in server.registry.nodes  # the dead node was deregistered
            wait_for(lambda: replacement[0] in server.registry.nodes, 60, "replacement did not register")
            results = [r for g in server.run_groups([group(3, 4)], timeout_s=300) for r in g]
            assert [r.reward for r in results] == [1.0] * 4
            assert replacement[0] in {r.node_id for r in results}
        finally:
            nodes.close()
