"""A session reaches its own model calls and nothing else (issue 31, item 1; the gateway side of item 4).

The agent is untrusted: a coding CLI in bubblewrap, or a plain program (a ``command`` harness). Each attack
below is made the way an agent would make it, with real processes on loopback, against the gateway polar
starts for a run (:class:`~polar.rollout.sessions.local.LocalStack`): the admin routes (status, pause,
weights), the session list, a sibling session's records, and writing into a sibling's session. Every one
must get 401/403/404 and change nothing. Browsers (CSRF, DNS rebinding) and ``polar gateway``'s secrets are
tried the same way."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.config.gateway import GatewayConfig
from polar.harness.agent.verifiers import Verdict, VerifyInput

DENIED = {401, 403, 404}
SECRET = "victim-secret-7f3a91"  # the sibling's prompt: must never come back to the attacker

#: The agent program: one honest model call of its own, then (as attacker) every route it should not reach.
#: Standard library only: it runs under /usr/bin/python3 inside bubblewrap as well as on the host.
AGENT = r'''#!/usr/bin/python3
import json, os, sys, urllib.error, urllib.request

base = os.environ["OPENAI_BASE_URL"].rstrip("/")  # <root>/s/<session>/v1
key = os.environ["OPENAI_API_KEY"]
if "--prompt" in sys.argv:
    task = json.loads(sys.argv[sys.argv.index("--prompt") + 1])
else:
    task = json.load(open(os.environ["POLAR_TASK_FILE"]))
    task = json.loads(task["prompt"])
root, _, rest = base.partition("/s/")
me = rest.split("/")[0]


def call(method, url, body=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    hdrs = {"content-type": "application/json", "authorization": "Bearer " + key}
    hdrs.update(headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return [r.status, r.read().decode("utf-8", "replace")[:2000]]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode("utf-8", "replace")[:2000]]
    except Exception as e:
        return [-1, repr(e)]


def uds_call(path, method, target, body=b"{}"):
    """Raw HTTP straight to the relay's Unix socket, skipping the in-sandbox relay (which is untrusted)."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    try:
        s.connect(path)
        s.sendall(("%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                   "Connection: close\r\n\r\n" % (method, target, len(body))).encode() + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return [int(data.split(b" ", 2)[1]), data.decode("utf-8", "replace")[:2000]]
    except Exception as e:
        return [-1, repr(e)]
    finally:
        s.close()


def relay_socket():
    """The host relay's socket path, as an agent finds it: the in-sandbox relay's command line."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                args = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
            except OSError:
                continue
            if b"--uds" in args:
                return args[args.index(b"--uds") + 1].decode()
    return None


out = {"own_call": call("POST", base + "/chat/completions",
                        {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": task["say"]}]})}
if task["role"] == "attacker":
    victim = task["victim"]
    forged = {"authorization": "Bearer polar-session-" + victim}
    roots = {"relay": root, "prefixed": root + "/s/" + me}
    if task.get("gateway"):
        roots["gateway"] = task["gateway"]  # the real address, as a program that scanned the loopback finds it
    for where, r in roots.items():
        out[where + ":admin_status"] = call("GET", r + "/admin/status")
        out[where + ":admin_pause"] = call("POST", r + "/admin/pause?timeout_s=0")
        out[where + ":admin_weights"] = call("POST", r + "/admin/weights",
                                             {"path": task["weights"], "policy_version": 777, "timeout_s": 5})
        out[where + ":admin_claim"] = call("POST", r + "/admin/claim", {"session_id": victim, "api_key": key})
        out[where + ":list_sessions"] = call("GET", r + "/sessions")
        out[where + ":read_sibling"] = call("GET", r + "/sessions/" + victim)
        out[where + ":read_sibling_trajectory"] = call("GET", r + "/sessions/" + victim + "/trajectory")
        out[where + ":read_sibling_forged_key"] = call("GET", r + "/sessions/" + victim, headers=forged)
        out[where + ":append_to_sibling"] = call(
            "POST", r + "/s/" + victim + "/v1/chat/completions",
            {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "injected"}]})
        out[where + ":append_to_sibling_forged_key"] = call(
            "POST", r + "/v1/chat/completions",
            {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "injected"}]}, forged)
    uds = relay_socket()
    if uds:
        out["found_socket"] = [404, uds]  # (not an attack: says the socket attacks below ran)
        for target in ("/admin/status", "/admin/pause?timeout_s=0", "/sessions", "/sessions/" + victim,
                       "/s/" + me + "/admin/pause?timeout_s=0", "/s/" + victim + "/v1/chat/completions"):
            out["socket:" + target] = uds_call(uds, "POST" if "pause" in target or "/v1/" in target else "GET", target)
        body = json.dumps({"path": task["weights"], "policy_version": 777}).encode()
        out["socket:/admin/weights"] = uds_call(uds, "POST", "/admin/weights", body)
with open("attack.json", "w") as f:
    json.dump(out, f)
print(json.dumps({"type": "result", "result": "done"}))
'''


class Collect:
    """A verifier that keeps what the agent program wrote (``attack.json``) per session."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, list[Any]]] = {}

    async def __call__(self, inp: VerifyInput) -> Verdict:
        path = Path(inp.workspace) / "attack.json"
        self.seen[inp.task["id"]] = json.loads(path.read_text()) if path.exists() else {}
        return Verdict(reward=0.0)


def _agent_file(tmp_path: Path) -> str:
    folder = tmp_path / "agent-bin"
    folder.mkdir(mode=0o755)
    path = folder / "qwen"
    path.write_text(AGENT)
    path.chmod(0o755)
    return str(path)


def _zero_weights(engine: Any, tmp_path: Path) -> str:
    """The poisoned checkpoint of the attack: every parameter zeroed, in a file the gateway can read."""
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "poison.safetensors"
    save_file({k: torch.zeros_like(v).contiguous() for k, v in engine.model.state_dict().items()}, str(path))
    path.chmod(0o644)
    return str(path)


@pytest.fixture
def engine() -> Any:
    from polar.inference.scripted import ScriptedEngine
    from polar.inference.tiny import build_tiny

    model, tokenizer = build_tiny(0)
    return ScriptedEngine(tokenizer, lambda r, i: "ok", model=model, model_name="tiny")


def _run_pair(engine: Any, runner: Any, tmp_path: Path, gateway_in_task: bool) -> tuple[Any, Collect, str, str]:
    """A run's stack; the victim session runs (its prompt holds SECRET), then the attacker, who knows its id."""
    from polar.rollout.sessions.local import LocalStack
    from polar.rollout.sessions.pipeline import PipelineSettings
    from polar.rollout.sessions.session import SessionSpec, SessionStatus

    collect = Collect()
    settings = PipelineSettings(agent_timeout_s=120, session_budget_s=240, workspace_root=str(tmp_path / "ws"))
    stack = LocalStack(engine, runner, collect, settings, records_dir=tmp_path / "records").start()
    victim, attacker = f"ses-victim-{uuid.uuid4().hex[:8]}", f"ses-attacker-{uuid.uuid4().hex[:8]}"
    weights = _zero_weights(engine, tmp_path)

    def run(sid: str, task: dict[str, Any]) -> Any:
        async def go() -> Any:
            assert stack.rollout.pipeline is not None
            return await stack.rollout.pipeline.submit(SessionSpec(sid, task, task_id=task["id"]))

        return stack.rollout.call(go(), 300)

    try:
        prompt = {"role": "victim", "say": SECRET}
        res = run(victim, {"id": "victim", "prompt": json.dumps(prompt)})
        assert res.status == SessionStatus.DONE, res.error
        prompt = {"role": "attacker", "say": "hi", "victim": victim, "weights": weights,
                  "gateway": stack.gateway.url if gateway_in_task else None}
        res = run(attacker, {"id": "attacker", "prompt": json.dumps(prompt)})
        assert res.status == SessionStatus.DONE, res.error
        status = stack.gateway.app.gate.status()
        records = {sid: [r.to_dict() for r in stack.gateway.records(sid)] for sid in (victim, attacker)}
    finally:
        stack.stop()
    return (status, records), collect, victim, attacker


def _own_listing(result: list[Any], attacker: str) -> bool:
    """``GET /sessions`` with a session's key lists that key's sessions: its own, nothing else."""
    if result[0] != 200:
        return False
    return set(json.loads(result[1])["sessions"]) <= {attacker}


def _assert_contained(engine: Any, outcome: tuple[Any, Any], collect: Collect, victim: str, attacker: str) -> None:
    status, records = outcome
    attacks = collect.seen["attacker"]
    assert attacks["own_call"][0] == 200, attacks["own_call"]  # its own model calls work
    tried = {name: result for name, result in attacks.items() if name != "own_call"}
    assert len(tried) >= 20
    tried.pop("found_socket", None)
    let_through = {name: result for name, result in tried.items() if result[0] not in DENIED
                   and not (name.endswith(":list_sessions") and _own_listing(result, attacker))}
    assert not let_through, f"the agent reached: {let_through}"
    assert not any(SECRET in body for _, body in tried.values()), "the sibling's prompt reached the attacker"
    assert engine.policy_version != 777, "the agent loaded weights"
    assert not status.get("paused"), f"the agent paused the gateway: {status}"
    victim_text = json.dumps(records[victim])
    assert SECRET in victim_text and "injected" not in victim_text, "the attacker wrote into the victim's session"


@pytest.mark.skipif(sys.platform != "linux", reason="bubblewrap is Linux-only")
def test_sandboxed_agent_cannot_reach_admin_or_sibling_sessions(engine: Any, tmp_path: Path) -> None:
    """A CLI in bubblewrap (network: only the relay to the gateway) tries every admin and session route, on
    the relay's root and under its own ``/s/<id>/`` prefix; the relay and the gateway refuse them all."""
    from polar.config.harness import AgentHarnessConfig
    from polar.harness.agent.build import build_runner
    from polar.harness.agent.sandbox import bwrap_unusable

    why = bwrap_unusable()
    if why is not None:
        pytest.skip(why)
    cfg = AgentHarnessConfig(type="agent", preset="qwen_code", preset_options={
        "bin": _agent_file(tmp_path), "sandbox": {"runtime": "bwrap", "network": "gateway"}})
    runner = build_runner(cfg, config_dir=tmp_path)
    outcome, collect, victim, attacker = _run_pair(engine, runner, tmp_path, gateway_in_task=False)
    assert "found_socket" in collect.seen["attacker"], "the agent did not find the relay's socket to attack it"
    _assert_contained(engine, outcome, collect, victim, attacker)


def test_unsandboxed_preset_cannot_reach_admin_or_sibling_sessions(engine: Any, tmp_path: Path) -> None:
    """The same CLI with ``sandbox.runtime: none`` (no bubblewrap on the machine, or chosen): its gateway
    address is still a per-session relay, and the gateway's own locks stand behind it."""
    from polar.config.harness import AgentHarnessConfig
    from polar.harness.agent.build import build_runner

    cfg = AgentHarnessConfig(type="agent", preset="qwen_code", preset_options={
        "bin": _agent_file(tmp_path), "sandbox": {"runtime": "none"}})
    runner = build_runner(cfg, config_dir=tmp_path)
    outcome, collect, victim, attacker = _run_pair(engine, runner, tmp_path, gateway_in_task=False)
    _assert_contained(engine, outcome, collect, victim, attacker)


def test_command_agent_cannot_reach_admin_or_sibling_sessions(engine: Any, tmp_path: Path) -> None:
    """A ``command`` harness run on the host (``sandbox.runtime: none``; in bubblewrap it cannot even connect
    to the gateway, see test_command_harness_isolation.py) gets a per-session relay address; it also knows the
    gateway's real address (as a port scan finds it). The gateway itself refuses every admin and session route
    without its token or the session's own key, and a sibling's key cannot be forged."""
    from polar.harness.agent.runners import CommandRunner

    runner = CommandRunner([sys.executable, _agent_file(tmp_path)], task_input="file", sandbox={"runtime": "none"})
    outcome, collect, victim, attacker = _run_pair(engine, runner, tmp_path, gateway_in_task=True)
    _assert_contained(engine, outcome, collect, victim, attacker)


@contextlib.contextmanager
def _relay(gateway_url: str, session_id: str) -> Iterator[int]:
    """A :class:`SessionRelay` for ``session_id`` on a loopback port, on its own thread."""
    import threading

    from polar.harness.agent.session_relay import SessionRelay

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    relay = SessionRelay(gateway_url, session_id)
    server = asyncio.run_coroutine_threadsafe(relay.listen_tcp(), loop).result(10)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        asyncio.run_coroutine_threadsafe(relay.aclose(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


@pytest.fixture
def gateway(engine: Any, tmp_path: Path) -> Iterator[Any]:
    """A gateway as ``polar gateway`` starts one on loopback: no admin token (open to this machine)."""
    from polar.gateway.server import GatewayServer

    with GatewayServer(GatewayConfig(default_max_tokens=4), engine=engine, records_dir=tmp_path / "gw") as gw:
        yield gw


def _raw(port: int, payload: bytes, timeout_s: float = 30.0) -> bytes:
    """Send raw bytes on one connection and read until the peer closes (bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(payload)
        data, deadline = b"", time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            data += chunk
    return data


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def test_relay_refuses_admin_call_pipelined_after_a_model_call(gateway: Any) -> None:
    """On one keep-alive connection a model call, a chunked model call, then ``POST /admin/pause``, sent
    together (pipelined), and a request smuggling an admin call in a body framed both ways: the model calls
    are answered, the admin call gets the relay's 403 and never reaches the gateway."""
    call = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}).encode()
    chunked = (b"POST /s/me/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
               + f"{len(call):x}\r\n".encode() + call + b"\r\n0\r\n\r\n")
    with _relay(gateway.url, "me") as port:
        data = _raw(port, _post("/s/me/v1/chat/completions", call) + chunked + _post("/admin/pause?timeout_s=0", b"{}"))
        assert data.count(b"HTTP/1.1 200") == 2 and data.count(b"HTTP/1.1 403") == 1, data[-600:]
        smuggle = (b"POST /s/me/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4\r\n"
                   b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + _post("/admin/pause?timeout_s=0", b"{}"))
        data = _raw(port, smuggle)
        assert b"HTTP/1.1 403" in data, data[-600:]
        streamed = httpx.post(f"http://127.0.0.1:{port}/s/me/v1/chat/completions", timeout=60,
                              json={"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert not gateway.app.gate.status().get("paused")
    assert len(gateway.records("me")) == 3


def test_browser_page_cannot_pause_gateway(gateway: Any) -> None:
    """CSRF: a web page's form POST (``text/plain``, no preflight) to ``/admin/pause`` on an open loopback
    gateway, and a page's model call, are refused by their ``Origin``; an SDK (no Origin) still works."""
    for origin in ("http://evil.example", "null"):
        r = httpx.post(f"{gateway.url}/admin/pause?timeout_s=0", content=b"x=1", timeout=30,
                       headers={"origin": origin, "content-type": "text/plain"})
        assert r.status_code == 403, r.text
        assert "cross-origin" in r.json()["error"]["message"]
    r = httpx.post(f"{gateway.url}/s/page/v1/chat/completions", timeout=30, headers={"origin": "http://evil.example"},
                   json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 403
    assert not gateway.app.gate.status().get("paused")
    assert gateway.records("page") == []
    r = httpx.post(f"{gateway.url}/s/sdk/v1/chat/completions", timeout=60,
                   json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200


def test_dns_rebinding_host_is_refused(gateway: Any) -> None:
    """DNS rebinding: a page whose own domain now resolves to 127.0.0.1 reads and posts with ``Host`` set to
    that domain; the gateway answers only the names it goes by (IP literals, localhost, its host)."""
    port = gateway.port
    for method, path in (("GET", "/sessions"), ("GET", "/admin/status"), ("POST", "/admin/pause?timeout_s=0")):
        r = httpx.request(method, f"http://127.0.0.1:{port}{path}", headers={"host": f"rebind.evil.example:{port}"},
                          timeout=30)
        assert r.status_code == 403, (path, r.text)
        assert "gateway.allowed_hosts" in r.json()["error"]["message"]
    assert not gateway.app.gate.status().get("paused")
    assert httpx.get(f"http://127.0.0.1:{port}/sessions", headers={"host": f"localhost:{port}"}, timeout=30).status_code == 200


def _gateway_process(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if k != "POLAR_GATEWAY_ADMIN_TOKEN"}
    full.update({"OMP_NUM_THREADS": "1", "COLUMNS": "250", **(env or {})})
    return subprocess.Popen([sys.executable, "-m", "polar.cli.main", "gateway", "--model", "tiny", "--port", "0",
                             "--records-dir", str(tmp_path / f"records-{uuid.uuid4().hex[:6]}"), *args],
                            stderr=subprocess.PIPE, text=True, env=full, start_new_session=True)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_polar_gateway_refuses_public_host_without_token(tmp_path: Path) -> None:
    """``polar gateway --host 0.0.0.0`` without a token would open the admin API and every session to the
    network: it exits at once with one line naming the flag and how to give a token."""
    proc = _gateway_process(tmp_path, "--host", "0.0.0.0")
    try:
        rc = proc.wait(120)
    except subprocess.TimeoutExpired:
        _stop(proc)
        pytest.fail("polar gateway --host 0.0.0.0 started serving without an admin token")
    err = proc.stderr.read() if proc.stderr else ""
    assert rc != 0
    assert "--host 0.0.0.0" in err and "POLAR_GATEWAY_ADMIN_TOKEN" in err and "--admin-token-file" in err, err


def test_polar_gateway_takes_token_from_env_and_prints_its_bound_address(tmp_path: Path) -> None:
    """With the token in ``POLAR_GATEWAY_ADMIN_TOKEN`` (never on the command line, where ``ps`` shows it) the
    gateway listens on every interface, says so in its banner, and its admin routes need the token."""
    token = "tok-" + uuid.uuid4().hex
    proc = _gateway_process(tmp_path, "--host", "0.0.0.0", env={"POLAR_GATEWAY_ADMIN_TOKEN": token})
    try:
        banner, deadline = "", time.monotonic() + 240
        while "listening on" not in banner and time.monotonic() < deadline and proc.stderr is not None:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            banner += line
        m = re.search(r"listening on http://0\.0\.0\.0:(\d+)", banner)
        assert m, f"the banner does not show the bound address: {banner!r}"
        assert token not in Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
        url = f"http://127.0.0.1:{m.group(1)}"
        assert httpx.get(f"{url}/admin/status", timeout=30).status_code == 401
        assert httpx.get(f"{url}/admin/status", headers={"x-polar-admin-token": token}, timeout=30).status_code == 200
    finally:
        _stop(proc)


def test_run_admin_token_and_session_keys_never_reach_the_run_folder(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A short agent run: its gateway had a random admin token and each session a secret key, and none of
    them is anywhere in the run folder (config, logs, records, sessions, checkpoints)."""
    import secrets as secrets_module

    from polar.config import load_config
    from polar.inference import load_engine
    from polar.trainers.build import train_agentic
    from polar.trainers.run_dir import RunDir
    from tests.agent_support.helpers import HERE, write_jsonl

    made: list[str] = []
    real = secrets_module.token_urlsafe

    def recording(nbytes: int | None = None) -> str:
        value = real(nbytes)
        made.append(value)
        return value

    monkeypatch.setattr(secrets_module, "token_urlsafe", recording)
    made_by_stack: list[str] = []
    service_tokens: list[str] = []  # the rollout service's token: memory only as well
    from polar.rollout.sessions import local

    original_init = local.LocalStack.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        made_by_stack.append(self.gateway.config.admin_token)
        service_tokens.append(self.rollout.token)

    monkeypatch.setattr(local.LocalStack, "__init__", spy)
    sys.path.insert(0, str(HERE))
    try:
        write_jsonl(tmp_path / "tasks.jsonl", [{"id": f"t{i}", "prompt": f"Say something {i}."} for i in range(2)])
        (tmp_path / "run.yaml").write_text(
            "name: secrets\n"
            "harness: {type: agent, callable: \"agents_for_tests:one_token\", timeout_s: 120}\n"
            "tasks: tasks.jsonl\nverifier: {type: \"agents_for_tests:says_hello\"}\nmodel: {name_or_path: tiny}\n"
            "policy:\n  type: grpo\n  kwargs: {group_size: 2, tasks_per_step: 1, total_steps: 1, micro_batch_size: 4,"
            " learning_rate: 1.0e-2}\nlogging: {checkpoint_freq: 1, tensorboard: false}\n")
        cfg = load_config(tmp_path / "run.yaml")
        cfg = cfg.model_copy(update={"tasks": str(tmp_path / "tasks.jsonl")})
        cfg._config_dir = HERE
        run_dir = RunDir.create("secrets", tmp_path / "run")
        train_agentic(cfg, run_dir, engine=load_engine("tiny"))
    finally:
        sys.path.remove(str(HERE))
    assert made_by_stack and all(made_by_stack), "the run's gateway had no admin token"
    assert made_by_stack[0] in made  # a random one, made for this run
    assert service_tokens and service_tokens[0] in made
    secret = [t for t in made if len(t) >= 32]
    assert len(secret) >= 3  # the admin token and one key per session
    leaked = []
    for path in Path(run_dir.path).rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            leaked += [f"{path}: {t[:6]}..." for t in secret if t.encode() in data]
    assert not leaked, leaked
    assert stat.S_ISDIR(os.stat(run_dir.path).st_mode)


def test_admin_token_comes_from_a_file_or_the_environment_never_silently_from_argv(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``--admin-token-file`` and ``POLAR_GATEWAY_ADMIN_TOKEN`` give the token; a missing or empty file is
    named; ``--admin-token`` on the command line still works but warns that ``ps`` shows it."""
    import argparse

    from polar.cli.gateway_cmd import add_arguments, load_config
    from polar.errors import ConfigError

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    monkeypatch.delenv("POLAR_GATEWAY_ADMIN_TOKEN", raising=False)
    path = tmp_path / "token"
    path.write_text("from-file\n")
    assert load_config(parser.parse_args(["--admin-token-file", str(path), "--host", "0.0.0.0"])).admin_token == "from-file"
    monkeypatch.setenv("POLAR_GATEWAY_ADMIN_TOKEN", "from-env")
    assert load_config(parser.parse_args(["--host", "0.0.0.0"])).admin_token == "from-env"
    with pytest.raises(ConfigError, match=r"--admin-token-file .*missing: cannot read it"):
        load_config(parser.parse_args(["--admin-token-file", str(tmp_path / "missing")]))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=r"--admin-token-file .*empty is empty; write the token into it"):
        load_config(parser.parse_args(["--admin-token-file", str(tmp_path / "empty")]))
    capsys.readouterr()
    assert load_config(parser.parse_args(["--admin-token", "on-argv"])).admin_token == "on-argv"
    assert "ps" in capsys.readouterr().err


def _established_to(port: int) -> int:
    """Open TCP connections whose local end is ``port`` (the server side of each), from /proc/net/tcp."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    count += 1
    return count


def test_agent_cannot_hold_unbounded_gateway_connections_through_relay(gateway: Any) -> None:
    """An agent opens 120 connections to its relay, each starting a model call whose body never comes: the
    relay holds at most ``MAX_CONNECTIONS`` of them (each its one gateway connection) and answers the rest
    503 at once, so one session cannot use up the gateway's connections; the gateway still serves."""
    from polar.harness.agent.session_relay import MAX_CONNECTIONS

    head = (b"POST /s/me/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000\r\n\r\n{")
    with _relay(gateway.url, "me") as port:
        held = []
        try:
            for _ in range(120):
                s = socket.create_connection(("127.0.0.1", port), timeout=30)
                s.sendall(head)
                held.append(s)
            time.sleep(1.0)
            refused = 0
            for s in held:
                s.settimeout(0.05)
                with contextlib.suppress(OSError):
                    if s.recv(4096).startswith(b"HTTP/1.1 503"):
                        refused += 1
            assert refused >= 120 - MAX_CONNECTIONS
            assert _established_to(gateway.port) <= MAX_CONNECTIONS
        finally:
            for s in held:
                s.close()
        deadline, status = time.monotonic() + 30, 0
        while status != 200 and time.monotonic() < deadline:  # the relay notices the hang-ups within moments
            status = httpx.post(f"http://127.0.0.1:{port}/s/me/v1/chat/completions", timeout=60,
                                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}).status_code
            time.sleep(0.1)
        assert status == 200


def test_sibling_cannot_create_a_session_before_the_run_opens_it_on_a_remote_node(engine: Any, tmp_path: Path) -> None:
    """A remote gateway node as a run starts one (its own admin token, ``claimed_sessions_only``): a program that
    learnt a future session's id calls it first (to own it and write into it) and is refused; the rollout
    service then opens it for the session's key over HTTP with the node's token, the session's calls work, and
    the service reads its records with the token."""
    from polar.gateway.server import GatewayServer
    from polar.rollout.sessions.nodes import NodeRegistry
    from polar.types import new_session_key

    token = "node-token-" + uuid.uuid4().hex
    cfg = GatewayConfig(default_max_tokens=4, admin_token=token, claimed_sessions_only=True)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    with GatewayServer(cfg, engine=engine, records_dir=tmp_path / "node") as gw:
        early = httpx.post(f"{gw.url}/s/ses-future/v1/chat/completions", json=body, timeout=60,
                           headers={"authorization": "Bearer attacker-key"})
        assert early.status_code == 403 and "was not opened by this run" in early.json()["error"]["message"]
        key = new_session_key("ses-future")

        async def service_side() -> list[Any]:
            registry = NodeRegistry()
            node = registry.register("remote", gw.url, admin_token=token)
            try:
                await registry.claim(node, "ses-future", key)
                async with httpx.AsyncClient(timeout=60) as http:
                    ok = await http.post(f"{gw.url}/s/ses-future/v1/chat/completions", json=body,
                                         headers={"authorization": f"Bearer {key}"})
                    assert ok.status_code == 200, ok.text
                    stolen = await http.post(f"{gw.url}/s/ses-future/v1/chat/completions", json=body,
                                             headers={"authorization": "Bearer attacker-key"})
                    assert stolen.status_code == 403
                return await registry.records(node, "ses-future")
            finally:
                await registry.aclose()

        records = asyncio.run(service_side())
    assert len(records) == 1
