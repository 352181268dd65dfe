"""Sessions whose gateway node dies are re-dispatched to a live node; other failures are not retried.

The nodes are real: gateway processes that heartbeat to the rollout service and are SIGKILLed mid-RUN,
or registered URLs on a port that refuses connections (a node whose process is gone).
"""

import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from polar.harness.agent.runners import CallableRunner
from polar.harness.agent.verifiers import UserFunction
from polar.rollout.sessions.local import LocalStack, RolloutServer
from polar.rollout.sessions.pipeline import PipelineSettings
from polar.rollout.sessions.session import SessionStatus
from tests.agent_support.helpers import HERE, calc_tasks

ROOT = HERE.parent.parent


def runner():
    return CallableRunner("agents_for_tests:calc_or_stall", HERE)


def verifier():
    return UserFunction("agents_for_tests:calc_verifier", HERE)


def wait_for(pred, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def start_node(server, node_id, log_dir: Path, heartbeat_interval_s=0.2):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    with open(log_dir / f"{node_id}.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.agent_support.gateway_node", server.url, node_id, str(heartbeat_interval_s)],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log)
    proc.stdin.write(server.token.encode() + b"\n")  # the service token, never on the command line
    proc.stdin.close()
    return proc


@pytest.fixture
def refusing_url():
    """A bound but not listening port: connections are refused, as to a gateway whose process died."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def register(server, node_id, url):
    with httpx.Client(timeout=10, headers=server.headers) as http:
        assert http.post(f"{server.url}/nodes/register", json={"node_id": node_id, "url": url}).status_code == 200
        assert http.post(f"{server.url}/nodes/{node_id}/heartbeat", json={}).status_code == 200


def test_killed_node_sessions_are_redispatched_to_the_survivor(tmp_path, no_leftovers):
    settings = PipelineSettings(agent_timeout_s=120, session_budget_s=300, workspace_root=str(tmp_path / "ws"),
                                model_name="tiny", max_node_retries=2, node_wait_s=30)
    markers = tmp_path / "markers"
    markers.mkdir()
    # heartbeats every 0.2 s; 10 s of silence is the killed node's, never a live node's on a loaded machine
    # (a spurious loss of n1 would re-dispatch its sessions too and change every count below)
    with RolloutServer(runner(), verifier(), settings, heartbeat_timeout_s=10.0) as server, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        procs = {nid: start_node(server, nid, tmp_path) for nid in ("n0", "n1")}
        try:
            wait_for(lambda: len(server.registry.nodes) == 2, 90, "the gateway node processes did not register")
            victim_url = server.registry.nodes["n0"].url
            survivor_url = server.registry.nodes["n1"].url
            tasks = [dict(t, stall_on=victim_url, marker_dir=str(markers)) for t in calc_tasks(2)]
            groups = [(t, 2, {"group_id": t["id"]}) for t in tasks]
            job = pool.submit(server.run_groups, groups, 120)
            # least-loaded placement puts two of the four sessions on n0; both stall there after one call
            wait_for(lambda: len(list(markers.iterdir())) == 2, 60, "sessions did not reach RUN on the victim")
            stalled = sorted(p.name for p in markers.iterdir())
            procs["n0"].send_signal(signal.SIGKILL)
            procs["n0"].wait(10)
            results = [r for g in job.result(timeout=120) for r in g]
            health = httpx.get(f"{server.url}/health", timeout=10).json()
            survivor_sessions = httpx.get(f"{survivor_url}/sessions", timeout=10).json()["sessions"]
        finally:
            for p in procs.values():
                p.kill()
                p.wait(10)
    assert [(r.status, r.reward) for r in results] == [(SessionStatus.DONE, 1.0)] * 4, [r.error for r in results]
    assert {r.node_id for r in results} == {"n1"}  # every session finished on the survivor
    assert all(r.samples and sum(r.samples[0].loss_mask) > 0 for r in results)
    moved = sorted(r.session_id for r in results if r.redispatched)
    assert moved == stalled and all(r.attempts == 2 for r in results if r.redispatched)
    assert sum(r.attempts == 1 for r in results) == 2
    for r in results:
        if r.redispatched:
            # the hung harness was stopped when n0's heartbeat stopped, not left to its agent timeout
            assert [n["node_id"] for n in r.lost_nodes] == ["n0"] and "no heartbeat" in r.lost_nodes[0]["reason"]
            assert f"{r.session_id}-attempt2" in survivor_sessions  # a fresh gateway key per attempt
    assert health["sessions_redispatched"] == 2 and health["sessions_node_lost"] == 0
    assert {n["node_id"]: n["healthy"] for n in health["nodes"]} == {"n0": False, "n1": True}


def test_refused_calls_move_the_session_to_a_live_node(oracle_engine, tmp_path, refusing_url):
    """A harness whose calls are refused fails fast; the probe finds the node gone, and the session moves."""
    settings = PipelineSettings(agent_timeout_s=120, workspace_root=str(tmp_path / "ws"), max_node_retries=2)
    with LocalStack(oracle_engine, runner(), verifier(), settings) as st:
        register(st.rollout, "dead", refusing_url)
        results = [r for g in st.run_groups([(t, 2, {}) for t in calc_tasks(2)], timeout_s=120) for r in g]
        health = httpx.get(f"{st.rollout.url}/health", timeout=10).json()
    assert [r.reward for r in results] == [1.0] * 4, [r.error for r in results]
    assert {r.node_id for r in results} == {"local"}
    moved = [r for r in results if r.redispatched]
    assert len(moved) == 2 and all(r.attempts == 2 for r in moved)  # placement alternated local, dead, local, dead
    assert all(r.lost_nodes[0]["node_id"] == "dead" and "unreachable" in r.lost_nodes[0]["reason"] for r in moved)
    assert health["sessions_redispatched"] == 2
    assert {n["node_id"]: n["down"] is not None for n in health["nodes"]} == {"local": False, "dead": True}


def test_failures_that_are_not_the_nodes_are_not_retried(oracle_engine, tmp_path):
    settings = PipelineSettings(agent_timeout_s=10, workspace_root=str(tmp_path / "ws"), max_node_retries=2)
    task = calc_tasks(1)[0]
    groups = [(dict(task, crash=True), 1, {}), (dict(task, break_verifier=True), 1, {}),
              (dict(task, hang_s=60), 1, {}), (task, 1, {})]
    with LocalStack(oracle_engine, runner(), verifier(), settings) as st:
        crashed, broken, hung, ok = (g[0] for g in st.run_groups(groups, timeout_s=120))
        assert st.rollout.pipeline.sessions_redispatched == 0
    assert crashed.status == SessionStatus.ERROR and "the agent crashed" in crashed.error
    assert broken.status == SessionStatus.ERROR and "the verifier is broken" in broken.error
    assert hung.status == SessionStatus.TIMEOUT and "agent timed out" in hung.error
    assert ok.status == SessionStatus.DONE and ok.reward == 1.0
    assert all(r.attempts == 1 and not r.lost_nodes and r.node_id == "local" for r in (crashed, broken, hung, ok))


def test_no_healthy_node_left_ends_in_error(tmp_path, refusing_url):
    settings = PipelineSettings(agent_timeout_s=60, workspace_root=str(tmp_path / "ws"), max_node_retries=2,
                                node_wait_s=1.0, model_name="tiny")
    with RolloutServer(runner(), verifier(), settings) as server:
        register(server, "only", refusing_url)
        [[result]] = server.run_groups([(calc_tasks(1)[0], 1, {})], timeout_s=60)
        assert server.pipeline.sessions_node_lost == 1
    assert result.status == SessionStatus.ERROR and result.reward is None
    assert "gateway node only was lost mid-session" in result.error
    assert "no healthy gateway node with free capacity took the session over" in result.error
    assert "node_wait_s=1.0" in result.error and result.lost_nodes[0]["node_id"] == "only"


def test_redispatch_stops_after_max_node_retries(tmp_path, refusing_url):
    settings = PipelineSettings(agent_timeout_s=60, workspace_root=str(tmp_path / "ws"), max_node_retries=1,
                                node_wait_s=1.0, model_name="tiny")
    with RolloutServer(runner(), verifier(), settings) as server:
        register(server, "a", refusing_url)
        register(server, "b", refusing_url + "/")  # a second dead node (same dead port, its own entry)
        [[result]] = server.run_groups([(calc_tasks(1)[0], 1, {})], timeout_s=60)
        load = server.pipeline.load()
    assert result.status == SessionStatus.ERROR and result.attempts == 2
    assert [n["node_id"] for n in result.lost_nodes] == ["a", "b"]
    assert "already re-dispatched 1 time(s), the most max_node_retries=1 allows" in result.error
    assert load["sessions_redispatched"] == 1 and load["sessions_node_lost"] == 1
