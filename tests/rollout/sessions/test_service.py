"""The rollout service over real HTTP: submit/poll/callback/list/cancel, SSE, /health, gateway nodes."""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest

from polar.harness.agent.runners import CallableRunner
from polar.harness.agent.verifiers import ExactMatch, UserFunction
from polar.rollout.sessions.local import LocalStack
from polar.rollout.sessions.nodes import NodeRegistry
from polar.rollout.sessions.pipeline import PipelineSettings
from tests.agent_support.helpers import EXAMPLES, HERE


@pytest.fixture
def stack(oracle_engine, tmp_path):
    runner = CallableRunner("calculator_agent:agent", EXAMPLES)
    settings = PipelineSettings(agent_timeout_s=120, workspace_root=str(tmp_path / "ws"), max_run_workers=4)
    with LocalStack(oracle_engine, runner, UserFunction("verifier:verify", EXAMPLES), settings) as st:
        yield st


def poll(http, url, task_id):
    """The task once every session has its result. A cancelled task says "cancelled" at once, while its
    sessions are still winding down: that status alone does not mean the results are in."""
    for _ in range(120):
        body = http.get(f"{url}/tasks/{task_id}", params={"wait_s": 5}).json()
        if body["status"] != "running" and body["completed_sessions"] == body["num_samples"]:
            return body
    raise AssertionError("task did not finish")


class _Sink(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        _Sink.received.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


def test_submit_poll_callback_list_and_events(stack):
    url = stack.rollout.url
    sink = HTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    events = []
    subscribed = threading.Event()

    def follow():
        with httpx.stream("GET", f"{url}/events", params={"max_events": 14}, timeout=120,
                          headers=stack.rollout.headers) as r:
            for line in r.iter_lines():
                subscribed.set()  # the server's opening comment: the subscription exists
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert subscribed.wait(60), "the event stream did not open"
    with httpx.Client(timeout=60, headers=stack.rollout.headers) as http:
        task = {"id": "q1", "prompt": "What is 2 + 3?", "answer": "5"}
        r = http.post(f"{url}/tasks", json={"task": task, "num_samples": 3, "metadata": {"group_id": "g1", "policy_version": 0},
                                           "callback_url": f"http://127.0.0.1:{sink.server_port}/done"})
        assert r.status_code == 200
        tid = r.json()["task_id"]
        body = poll(http, url, tid)
        assert body["status"] == "done" and body["completed_sessions"] == 3
        assert [res["reward"] for res in body["results"]] == [1.0, 1.0, 1.0]
        sample = body["results"][0]["samples"][0]
        assert sample["group_id"] == "g1" and sample["metadata"]["policy_version"] == 0
        assert sum(sample["loss_mask"]) > 0 and len(sample["token_ids"]) == len(sample["loss_mask"])
        assert body["results"][0]["verifier_output"]["expected"] == "5"
        assert [t["task_id"] for t in http.get(f"{url}/tasks", params={"status": "done"}).json()["tasks"]] == [tid]
        # bad requests are answered, not crashed on
        assert http.post(f"{url}/tasks", json={"task": task, "num_samples": 0}).status_code == 400
        assert http.post(f"{url}/tasks", json={"tsk": task}).status_code == 400
        assert http.post(f"{url}/tasks", content=b"{not json").status_code == 400
        assert http.get(f"{url}/tasks/nope").status_code == 404
        health = http.get(f"{url}/health").json()
        assert set(health["stages"]) >= {"init", "run", "post_run"} and health["stages"]["run"]["workers"] == 4
    follower.join(60)
    deadline = time.monotonic() + 60  # the callback is posted after the task is done, on the service's loop
    while not _Sink.received and time.monotonic() < deadline:
        time.sleep(0.1)
    sink.shutdown()
    assert _Sink.received and _Sink.received[0]["task_id"] == tid and len(_Sink.received[0]["results"]) == 3
    statuses = [e["status"] for e in events if e["type"] == "session"]
    assert {"init", "run", "post_run", "done"} <= set(statuses) and statuses.count("done") == 3
    assert [e["status"] for e in events if e["type"] == "task"] == ["running", "done"]


def test_cancel_task(oracle_engine, tmp_path):
    runner = CallableRunner("agents_for_tests:ask_then_sleep", HERE)
    settings = PipelineSettings(agent_timeout_s=300, workspace_root=str(tmp_path / "ws"))
    with LocalStack(oracle_engine, runner, ExactMatch(), settings) as st, httpx.Client(timeout=60) as http:
        http.headers.update(st.rollout.headers)
        url = st.rollout.url
        tid = http.post(f"{url}/tasks", json={"task": {"prompt": "hi", "answer": "x", "sleep_s": 600}, "num_samples": 2}).json()["task_id"]
        for _ in range(300):  # wait until both sessions are running their harness
            if http.get(f"{url}/health").json()["stages"]["run"]["active"] == 2:
                break
            time.sleep(0.1)
        assert http.delete(f"{url}/tasks/{tid}").json()["status"] == "cancelled"
        body = poll(http, url, tid)
        assert body["status"] == "cancelled"
        assert [r["status"] for r in body["results"]] == ["cancelled", "cancelled"]
        assert all(not any(s["loss_mask"]) for r in body["results"] for s in r["samples"])


def test_least_loaded_healthy_node_and_http_records(stack, tmp_path):
    from polar.gateway import GatewayServer
    from polar.inference import ScriptedEngine
    from polar.inference.tiny import build_tiny_tokenizer
    from tests.agent_support.helpers import oracle_script

    url = stack.rollout.url
    tok = build_tiny_tokenizer()
    with GatewayServer(engine=ScriptedEngine.tiny(oracle_script(tok))) as gw2, \
            httpx.Client(timeout=60, headers=stack.rollout.headers) as http:
        assert http.post(f"{url}/nodes/register", json={"node_id": "n2", "url": gw2.url}).status_code == 200
        assert http.post(f"{url}/nodes/n2/heartbeat", json={"active_sessions": 0}).status_code == 200
        assert http.post(f"{url}/nodes/ghost/heartbeat", json={}).status_code == 404
        tid = http.post(f"{url}/tasks", json={"task": {"prompt": "What is 1 + 1?", "answer": "2"}, "num_samples": 4}).json()["task_id"]
        body = poll(http, url, tid)
        nodes = sorted(r["node_id"] for r in body["results"])
        assert nodes == ["local", "local", "n2", "n2"]  # placed on the least-loaded node each time
        assert all(r["reward"] == 1.0 and r["num_calls"] == 2 for r in body["results"])  # n2 read over HTTP
        # a node reporting heavy load gets nothing new
        http.post(f"{url}/nodes/n2/heartbeat", json={"active_sessions": 100})
        tid = http.post(f"{url}/tasks", json={"task": {"prompt": "What is 1 + 2?", "answer": "3"}, "num_samples": 2}).json()["task_id"]
        assert {r["node_id"] for r in poll(http, url, tid)["results"]} == {"local"}
        assert {n["node_id"] for n in http.get(f"{url}/nodes").json()["nodes"]} == {"local", "n2"}
        http.delete(f"{url}/nodes/n2")
        assert {n["node_id"] for n in http.get(f"{url}/nodes").json()["nodes"]} == {"local"}


def test_registry_skips_silent_nodes():
    reg = NodeRegistry(heartbeat_timeout_s=30)
    a = reg.register("a", "http://127.0.0.1:1")
    b = reg.register("b", "http://127.0.0.1:2")
    a.last_heartbeat -= 100  # silent for 100 s
    assert reg.pick() is b and reg.pick() is b
    b.last_heartbeat -= 100
    with pytest.raises(Exception, match="no healthy gateway node"):
        reg.pick()
    with pytest.raises(Exception, match="must start with http"):
        reg.register("c", "127.0.0.1:3")
    assert sys.modules  # keep imports used
