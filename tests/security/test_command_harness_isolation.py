"""The rollout service's API needs the run's token, and a ``command`` harness runs in the sandbox (issue 31).

Two holes left by the gateway-access work, each tried as an agent would, with real processes on loopback:

- an agent program on the host (a preset with ``sandbox.runtime: none``) that finds the rollout service's port
  lists tasks and their answers, cancels siblings, or registers a gateway node of its own, to which the run
  would send sessions (forged records, tokens and logprobs);
- a ``command`` harness program reads the run folder (a sibling's gateway records), the task file with its
  answers and host files, and connects to the rollout service and the gateway's real port.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from polar.harness.agent.verifiers import Verdict, VerifyInput

ROOT = Path(__file__).resolve().parents[2]
DENIED = {401, 403}
SECRET = "sibling-answer-5d1e07"  # the sibling's prompt and answer: must never reach the attacker

#: An agent program (standard library only, so it runs under any python inside bubblewrap): one model call of
#: its own, then every listening loopback port (as /proc/net/tcp lists them) gets every route of the service.
SCANNER = r'''#!/usr/bin/python3
import json, os, sys, urllib.error, urllib.request

base = os.environ["OPENAI_BASE_URL"].rstrip("/")
key = os.environ["OPENAI_API_KEY"]


def call(method, url, body=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=dict({"content-type": "application/json"},
                                                                             **(headers or {})))
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return [r.status, r.read().decode("utf-8", "replace")[:4000]]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode("utf-8", "replace")[:4000]]
    except Exception as e:
        return [-1, repr(e)]


def listening_ports():
    """Every listening loopback port, as /proc/net/tcp lists them; the test narrows them to its own run's
    (the box is shared: other processes' servers are left alone)."""
    ports = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        ip, port = local.split(":")
        if state == "0A" and ip in ("0100007F", "00000000"):
            ports.add(int(port, 16))
    try:
        only = set(json.loads(sys.argv[sys.argv.index("--prompt") + 1])["ports"])
    except ValueError:  # an honest session of the same program (its prompt is a question): no scan
        only = set()
    return sorted(ports & only)


out = {"own_call": call("POST", base + "/chat/completions", {"model": "tiny", "max_tokens": 4,
                        "messages": [{"role": "user", "content": "hi"}]}, {"authorization": "Bearer " + key})}
node = {"node_id": "evil", "url": "http://127.0.0.1:9", "capacity": 1000, "admin_token": "x"}
for port in listening_ports():
    root = "http://127.0.0.1:%d" % port
    if call("GET", root + "/health")[0] == -1:
        continue
    for bearer in (None, key, "polar"):  # no token, its own session key, a guess
        h = {"authorization": "Bearer " + bearer} if bearer else {}
        tag = "%d:%s:" % (port, "none" if bearer is None else "key" if bearer == key else "guess")
        out[tag + "list_tasks"] = call("GET", root + "/tasks", headers=h)
        out[tag + "get_task"] = call("GET", root + "/tasks/sibling?wait_s=0", headers=h)
        out[tag + "submit"] = call("POST", root + "/tasks", {"task": {"prompt": "x", "answer": "x"}}, h)
        out[tag + "cancel"] = call("DELETE", root + "/tasks/sibling", headers=h)
        out[tag + "events"] = call("GET", root + "/events?max_events=1", headers=h)
        out[tag + "nodes"] = call("GET", root + "/nodes", headers=h)
        out[tag + "register"] = call("POST", root + "/nodes/register", node, h)
        out[tag + "heartbeat"] = call("POST", root + "/nodes/local/heartbeat", {"active_sessions": 0}, h)
        out[tag + "remove_local"] = call("DELETE", root + "/nodes/local", headers=h)
with open("scan.json", "w") as f:
    json.dump(out, f)
print(json.dumps({"type": "result", "result": "done"}))
'''

#: A ``command`` agent (standard library only): its own model call, then the run folder, the task file, a host
#: file, and the rollout service and the gateway's real ports (named in its task, as a scan would find them).
SNOOPER = r'''
import json, os, socket, sys, urllib.error, urllib.request

task = json.load(open(os.environ["POLAR_TASK_FILE"]))
target = json.loads(task["prompt"])
base = os.environ["OPENAI_BASE_URL"].rstrip("/")
req = urllib.request.Request(base + "/chat/completions", method="POST", data=json.dumps(
    {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": target.get("say", "hi")}]}).encode(),
    headers={"content-type": "application/json", "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
try:
    with urllib.request.urlopen(req, timeout=60) as r:
        out = {"own_call": [r.status, r.read().decode()[:200]]}
except Exception as e:
    out = {"own_call": [-1, repr(e)]}


def read(path):
    try:
        if os.path.isdir(path):
            found = []
            for d, _, files in os.walk(path):
                for name in files:
                    found.append([os.path.join(d, name), read(os.path.join(d, name))])
            return ["dir", found]
        with open(path, "rb") as f:
            return ["read", f.read(100000).decode("utf-8", "replace")]
    except Exception as e:
        return ["denied", repr(e)]


def connect(url):
    host, port = url.split("//")[1].split(":")
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((host, int(port.strip("/"))))
        return ["connected", url]
    except Exception as e:
        return ["denied", repr(e)]
    finally:
        s.close()


for name, path in target["files"].items():
    out["read:" + name] = read(path)
for name, url in target["ports"].items():
    out["connect:" + name] = connect(url)
out["uid"] = os.getuid()
out["workspace"] = os.environ["POLAR_WORKSPACE"]
with open("snoop.json", "w") as f:
    json.dump(out, f)
print("done")
'''


class Keep:
    """A verifier that keeps the JSON file the agent program wrote in its workspace, per task id."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: dict[str, dict[str, Any]] = {}
        self.harness: dict[str, dict[str, Any]] = {}

    async def __call__(self, inp: VerifyInput) -> Verdict:
        path = Path(inp.workspace) / self.name
        self.seen[inp.task["id"]] = json.loads(path.read_text()) if path.exists() else {}
        self.harness[inp.task["id"]] = dict(inp.harness or {})
        return Verdict(reward=1.0)


def fresh_engine() -> Any:
    from polar.inference.scripted import ScriptedEngine
    from polar.inference.tiny import build_tiny

    model, tokenizer = build_tiny(0)
    return ScriptedEngine(tokenizer, lambda r, i: "ok", model=model, model_name="tiny")


@pytest.fixture
def engine() -> Any:
    return fresh_engine()


def _bwrap_or_skip() -> None:
    from polar.harness.agent.sandbox import bwrap_unusable

    if sys.platform != "linux":
        pytest.skip("bubblewrap is Linux-only")
    why = bwrap_unusable()
    if why is not None:
        pytest.skip(why)


def _run(stack: Any, sid: str, task: dict[str, Any]) -> Any:
    from polar.rollout.sessions.session import SessionSpec

    async def go() -> Any:
        assert stack.rollout.pipeline is not None
        return await stack.rollout.pipeline.submit(SessionSpec(sid, task, task_id=task["id"]))

    return stack.rollout.call(go(), 300)


def test_agent_program_scanning_loopback_cannot_use_the_rollout_service(engine: Any, tmp_path: Path) -> None:
    """A program on the host (a preset with ``sandbox.runtime: none``) finds the listening loopback ports (of
    this run: the box is shared, other processes' servers are left alone) and tries every route of the rollout service, with no token, its own session key and a guess: each gets
    401/403; no task is listed, cancelled or submitted, no node is registered or removed, and a sibling task
    running at the same time finishes. ``/health`` leaves out the nodes' addresses."""
    from polar.config.harness import AgentHarnessConfig
    from polar.harness.agent.build import build_runner
    from polar.rollout.sessions.local import LocalStack
    from polar.rollout.sessions.pipeline import PipelineSettings
    from polar.rollout.sessions.session import SessionStatus

    folder = tmp_path / "agent-bin"
    folder.mkdir()
    (folder / "qwen").write_text(SCANNER)
    (folder / "qwen").chmod(0o755)
    cfg = AgentHarnessConfig(type="agent", preset="qwen_code", preset_options={
        "bin": str(folder / "qwen"), "sandbox": {"runtime": "none"}})
    keep = Keep("scan.json")
    settings = PipelineSettings(agent_timeout_s=120, session_budget_s=240, workspace_root=str(tmp_path / "ws"))
    with LocalStack(engine, build_runner(cfg, config_dir=tmp_path), keep, settings,
                    records_dir=tmp_path / "records") as stack:
        service_port = stack.rollout.port
        # the ports this run listens on (the scanner intersects them with what /proc/net/tcp shows)
        ours = sorted({c.laddr.port for c in psutil.Process().net_connections(kind="tcp")
                       if c.status == psutil.CONN_LISTEN})
        assert service_port in ours
        res = _run(stack, f"ses-scan-{uuid.uuid4().hex[:8]}", {"id": "scanner", "prompt": json.dumps({"ports": ours})})
        assert res.status == SessionStatus.DONE, res.error
        assert set(stack.rollout.registry.nodes) == {"local"}, "the agent registered or removed a gateway node"
        assert stack.rollout.service is not None and not stack.rollout.service.tasks, "the agent submitted a task"
        # the run still collects through its own, authorized path
        (group,) = stack.run_groups([({"id": "sibling", "prompt": SECRET, "answer": SECRET}, 2, {})], timeout_s=300)
        assert [r.status for r in group] == [SessionStatus.DONE] * 2, [r.error for r in group]
        health = httpx.get(f"{stack.rollout.url}/health", timeout=10).json()
    scan = keep.seen["scanner"]
    assert scan["own_call"][0] == 200, scan["own_call"]
    tried = {k: v for k, v in scan.items() if k.startswith(f"{service_port}:")}
    assert len(tried) == 27, f"the scanner did not find the rollout service's port {service_port}: {sorted(scan)}"
    let_through = {k: v for k, v in tried.items() if v[0] not in DENIED}
    assert not let_through, f"the agent used the rollout service: {let_through}"
    assert health["nodes"] and all("url" not in n for n in health["nodes"]), health


def test_forged_gateway_node_registration_is_refused(engine: Any, tmp_path: Path) -> None:
    """Registering a node (to which sessions would be routed: forged records, tokens, logprobs) needs the run's
    service token: none, a wrong one, the gateway's Host guard and a cross-site page are all refused, the
    service never sends a session to the forged node, and the run's own client (the token) still works."""
    from polar.gateway.server import GatewayServer
    from polar.harness.agent.runners import CallableRunner
    from polar.rollout.sessions.local import LocalStack
    from polar.rollout.sessions.pipeline import PipelineSettings

    (tmp_path / "honest.py").write_text(
        "from openai import OpenAI\n"
        "def agent(base_url, task, api_key):\n"
        "    c = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)\n"
        "    return c.chat.completions.create(model='tiny', messages=[{'role': 'user', 'content': task['prompt']}],"
        " max_tokens=4).choices[0].message.content\n")
    settings = PipelineSettings(agent_timeout_s=60, workspace_root=str(tmp_path / "ws"))
    with LocalStack(engine, CallableRunner("honest:agent", tmp_path), Keep("none"), settings) as stack, \
            GatewayServer(engine=engine) as forged, httpx.Client(timeout=10) as http:
        url = stack.rollout.url
        node = {"node_id": "forged", "url": forged.url, "capacity": 1000}
        wrong = {"authorization": "Bearer " + "A" * 43}
        attempts = {
            "no_token": http.post(f"{url}/nodes/register", json=node),
            "wrong_token": http.post(f"{url}/nodes/register", json=node, headers=wrong),
            "token_as_query": http.post(f"{url}/nodes/register?token=polar", json=node),
            "basic_auth": http.post(f"{url}/nodes/register", json=node, auth=("polar", "polar")),
        }
        assert {k: r.status_code for k, r in attempts.items()} == dict.fromkeys(attempts, 401)
        assert "token" in attempts["no_token"].json()["error"]["message"]
        assert set(stack.rollout.registry.nodes) == {"local"}
        good = stack.rollout.headers  # even with the token: a rebinding page's Host, a cross-site page's Origin
        browser = {
            "rebinding_host": http.post(f"{url}/nodes/register", json=node,
                                        headers={**good, "host": f"evil.example:{stack.rollout.port}"}),
            "cross_site_page": http.post(f"{url}/nodes/register", json=node,
                                         headers={**good, "origin": "http://evil.example"}),
        }
        assert {k: r.status_code for k, r in browser.items()} == dict.fromkeys(browser, 403)
        assert set(stack.rollout.registry.nodes) == {"local"}
        (group,) = stack.run_groups([({"id": "t", "prompt": "hi", "answer": "ok"}, 4, {})], timeout_s=120)
        assert {r.node_id for r in group} == {"local"} and all(r.num_calls == 1 for r in group)
        assert forged.records(group[0].session_id) == []
        # the run's own client, with the token: allowed
        assert http.get(f"{url}/tasks", headers=good).status_code == 200
        assert http.get(f"{url}/health").status_code == 200


def test_command_agent_cannot_read_run_folder_or_reach_service_and_gateway(engine: Any, tmp_path: Path) -> None:
    """A ``command`` harness program (``{python}`` and a script next to the config) tries to read a sibling
    session's gateway records in the run folder, the task file with its answers, a file of the host outside
    (this repository's pyproject.toml) and the config folder's other files, and to connect to the rollout
    service's port and the gateway's real port: all fail. Its own model calls still work, through its relay."""
    _bwrap_or_skip()
    from polar.config.harness import AgentHarnessConfig
    from polar.harness.agent.build import build_runner
    from polar.rollout.sessions.local import LocalStack
    from polar.rollout.sessions.pipeline import PipelineSettings
    from polar.rollout.sessions.session import SessionStatus

    config_dir = tmp_path / "project"
    config_dir.mkdir()
    (config_dir / "agent.py").write_text(SNOOPER)
    (config_dir / "secrets.env").write_text("API_TOKEN=" + SECRET)  # next to the config, not named by the command
    run_dir = config_dir / "runs" / "r1"  # a run folder under the config folder, as `polar run` makes by default
    records = run_dir / "gateway" / "sessions"
    tasks = config_dir / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "sibling", "prompt": "What is the secret?", "answer": SECRET}) + "\n")
    cfg = AgentHarnessConfig(type="agent", command=["{python}", "{config_dir}/agent.py"], task_input="file")
    keep = Keep("snoop.json")
    settings = PipelineSettings(agent_timeout_s=120, session_budget_s=240, workspace_root=str(run_dir / "ws"))
    with LocalStack(engine, build_runner(cfg, config_dir=config_dir), keep, settings, records_dir=records) as stack:
        sibling = _run(stack, f"ses-sibling-{uuid.uuid4().hex[:8]}",
                       {"id": "sibling", "prompt": json.dumps({"files": {}, "ports": {}, "say": SECRET})})
        assert sibling.status == SessionStatus.DONE, sibling.error
        assert any(SECRET in p.read_text() for p in records.glob("*.jsonl")), "the sibling's record holds no secret"
        target = {
            "files": {"records": str(records), "run_folder": str(run_dir), "tasks": str(tasks),
                      "config_secrets": str(config_dir / "secrets.env"), "host_file": str(ROOT / "pyproject.toml"),
                      "sibling_record": str(next(records.glob("*.jsonl")))},
            "ports": {"rollout_service": stack.rollout.url, "gateway": stack.gateway.url},
        }
        res = _run(stack, f"ses-snoop-{uuid.uuid4().hex[:8]}", {"id": "snooper", "prompt": json.dumps(target)})
    assert res.status == SessionStatus.DONE and res.num_calls == 1, res.error
    snoop = keep.seen["snooper"]
    assert snoop["own_call"][0] == 200, snoop["own_call"]
    own = snoop["workspace"].rstrip("/") + "/"
    for v in snoop.values():  # a folder listing may show the agent's own workspace (the run folder holds it)
        if isinstance(v, list) and v and v[0] == "dir":
            v[1] = [entry for entry in v[1] if not entry[0].startswith(own)]
    reached = {k: v for k, v in snoop.items() if k.startswith(("read:", "connect:")) and v[0] != "denied"
               and not (v[0] == "dir" and not v[1])}
    assert not reached, f"the command agent reached: {json.dumps(reached)[:2000]}"
    assert SECRET not in json.dumps(snoop)
    assert keep.harness["snooper"]["sandbox"]["runtime"] == "bwrap", keep.harness["snooper"]
    if os.geteuid() == 0:  # polar as root: the program runs as nobody
        assert snoop["uid"] == 65534 and keep.harness["snooper"]["sandbox"]["user"] == "nobody", snoop["uid"]


# one model call through the session's relay (stdlib only: it runs under `python -I -S`)
ONE_CALL = """
import json, os, urllib.error, urllib.request
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", method="POST",
    data=json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode(),
    headers={"content-type": "application/json", "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
try:
    print(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["message"]["content"])
except urllib.error.HTTPError as e:
    raise SystemExit(f"HTTP {e.code}: {e.read()[:500]!r}")
"""


def test_command_agent_in_a_relative_run_folder_runs_in_the_sandbox(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`polar run` makes its run folder relative to the cwd (`runs/...`). Every sandboxed session of such a run
    used to end in ERROR (`bwrap: Can't find source path runs/...`), so a new user's first agent run trained on
    nothing. A one-call session is timed with and without the sandbox (the cost is reported, not asserted)."""
    _bwrap_or_skip()
    from polar.harness.agent.runners import CommandRunner
    from polar.rollout.sessions.local import LocalStack
    from polar.rollout.sessions.pipeline import PipelineSettings
    from polar.rollout.sessions.session import SessionStatus

    monkeypatch.chdir(tmp_path)
    program = tmp_path / "one_call.py"  # a file, not `-c`: a command's braces are task placeholders
    program.write_text(ONE_CALL)

    def timed(sandbox: dict[str, Any]) -> float:
        runner = CommandRunner([sys.executable, "-I", "-S", str(program)], sandbox=sandbox)
        settings = PipelineSettings(agent_timeout_s=60, workspace_root=f"runs/r1/ws-{sandbox['runtime']}")
        with LocalStack(fresh_engine(), runner, Keep("none"), settings) as stack:  # a stack closes its engine
            best = float("inf")
            for i in range(3):
                start = time.perf_counter()
                res = _run(stack, f"ses-{sandbox['runtime']}-{i}", {"id": "t", "prompt": "hi"})
                best = min(best, time.perf_counter() - start)
                assert res.status == SessionStatus.DONE, res.error
        return best

    bare, boxed = timed({"runtime": "none"}), timed({"runtime": "bwrap"})
    print(f"sandbox cost per session: {boxed - bare:+.3f}s ({bare:.3f}s -> {boxed:.3f}s)")


def test_command_harness_without_bubblewrap_warns_once_or_refuses(engine: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Where bubblewrap is missing, ``runtime: auto`` says once per run that the command runs unisolated (and
    the sessions still run), ``runtime: bwrap`` refuses when the runner is built, ``runtime: none`` is silent."""
    import logging

    from polar.errors import HarnessError
    from polar.harness.agent.runners import CommandRunner
    from polar.rollout.sessions.local import LocalStack
    from polar.rollout.sessions.pipeline import PipelineSettings
    from polar.rollout.sessions.session import SessionStatus
    from tests.harness.agent.presets.test_sandbox_degrade import path_without_bwrap

    monkeypatch.setenv("PATH", path_without_bwrap(tmp_path))
    (tmp_path / "agent.py").write_text(SNOOPER)
    with caplog.at_level(logging.WARNING):
        runner = CommandRunner([sys.executable, str(tmp_path / "agent.py")], task_input="file")
        settings = PipelineSettings(agent_timeout_s=60, workspace_root=str(tmp_path / "ws"))
        with LocalStack(engine, runner, Keep("snoop.json"), settings) as stack:
            (group,) = stack.run_groups([({"id": "t", "prompt": json.dumps({"files": {}, "ports": {}})}, 2, {})],
                                        timeout_s=120)
    assert [r.status for r in group] == [SessionStatus.DONE] * 2, [r.error for r in group]
    warned = [r.getMessage() for r in caplog.records if "runs with no isolation" in r.getMessage()]
    assert len(warned) == 1 and "harness.sandbox.runtime: none" in warned[0] and "bubblewrap is not installed" in warned[0]
    with pytest.raises(HarnessError, match="bubblewrap is not installed"):
        CommandRunner(["/bin/true"], sandbox={"runtime": "bwrap"})
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        CommandRunner(["/bin/true"], sandbox={"runtime": "none"})
    assert not [r for r in caplog.records if "isolation" in r.getMessage()]
