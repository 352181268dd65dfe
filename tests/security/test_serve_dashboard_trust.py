"""Attacks on what serves or reopens a run: the dashboard (a hostile web page, a hostile run folder), `polar
serve` (a hostile client, a hostile export) and `polar eval` / `export` / `serve` of someone else's run folder.

Real servers on 127.0.0.1, real HTTP (raw sockets where a client must misbehave), real subprocesses for the
commands, a real crafted TorchScript file."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
import yaml

from polar.config import dump_config, load_config
from polar.dashboard.server import DashboardServer
from polar.trainers.checkpoint import CheckpointManager
from polar.trainers.run_dir import RunDir

ROOT = Path(__file__).resolve().parents[2]
SECRET = "tok-" + "do-not-leak-7f3a9c"  # split: the literal never sits whole in this file's bytes on disk


def polar(*args: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout_s: float = 120):
    return subprocess.run([sys.executable, "-m", "polar.cli.main", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout_s, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def agent_run_folder(runs: Path, name: str = "agent") -> Path:
    """An agent run as the dashboard reads one: run.json and one rated-able session."""
    rd = RunDir.create(name, run_dir=runs / name, kind="agentic-grpo")
    rd.update_meta(status="finished")
    (rd.path / "sessions").mkdir()
    (rd.path / "sessions" / "index.jsonl").write_text(json.dumps(
        {"session_id": "ses-1", "task_id": "t1", "status": "ok", "reward": 1.0, "step": 0, "output": "hi"}) + "\n")
    return rd.path


@pytest.fixture
def dashboard():
    servers: list[DashboardServer] = []

    def start(root: Path, token: str | None = None) -> DashboardServer:
        s = DashboardServer(root, ratings_token=token).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


# ------------------------------------------------------------------------------------------ secrets
CONNECTOR_YAML = """
name: secretive
harness:
  type: custom
  connector_spec:
    module: my_game_connector
    class_name: Game
    transport: tcp
    token: {token}
    env: {{HF_TOKEN: {token}, LEVEL: "3"}}
agent: {{type: mlp}}
policy: {{type: ppo}}
"""


def test_dashboard_serves_no_token_from_config_resolved_yaml(tmp_path, dashboard, monkeypatch):
    monkeypatch.delenv("POLAR_CONNECTOR_TOKEN", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    cfg = load_config(write_config(tmp_path / "c.yaml", CONNECTOR_YAML.format(token=SECRET)))
    assert cfg.harness.connector_spec.token == SECRET  # the run itself has it
    runs = tmp_path / "runs"
    rd = RunDir.create("secretive", run_dir=runs / "new", kind="ppo")
    rd.write_config(dump_config(cfg))  # what `polar run` writes
    old = RunDir.create("old", run_dir=runs / "old", kind="ppo")  # a run written before redaction existed
    old.config_path.write_text(yaml.safe_dump({"harness": {"connector_spec": {"token": SECRET}},
                                               "gateway": {"admin_token": SECRET}}))
    assert SECRET.encode() not in rd.config_path.read_bytes()
    assert "LEVEL: '3'" in rd.config_path.read_text() or 'LEVEL: "3"' in rd.config_path.read_text()
    srv = dashboard(runs)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        for run in ("new", "old"):
            r = http.get(f"/files/{run}/config.resolved.yaml")
            assert r.status_code == 200 and SECRET not in r.text and "<redacted>" in r.text, r.text
        for path in ("/api/runs", "/api/keys?run=new", "/api/events?run=new", "/api/logs?run=new"):
            assert SECRET not in http.get(path).text


def test_a_redacted_secret_must_be_resupplied_from_the_environment_to_reopen_the_run(tmp_path, monkeypatch):
    from polar.errors import ConfigError
    from polar.trainers.loading import load_run

    monkeypatch.delenv("POLAR_CONNECTOR_TOKEN", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    cfg = load_config(write_config(tmp_path / "c.yaml", CONNECTOR_YAML.format(token=SECRET)))
    rd = RunDir.create("secretive", run_dir=tmp_path / "run", kind="ppo")
    rd.write_config(dump_config(cfg))
    with pytest.raises(ConfigError, match=r"harness\.connector_spec\.token was redacted .* set \$POLAR_CONNECTOR_TOKEN"):
        load_run(rd.path)  # what `polar resume` does first
    monkeypatch.setenv("POLAR_CONNECTOR_TOKEN", SECRET)
    with pytest.raises(ConfigError, match=r"harness\.connector_spec\.env\.HF_TOKEN was redacted .* set \$HF_TOKEN"):
        load_run(rd.path)
    token_file = tmp_path / "hf-token"
    token_file.write_text(SECRET + "-hf\n")
    monkeypatch.setenv("HF_TOKEN_FILE", str(token_file))
    _, again = load_run(rd.path)
    assert again.harness.connector_spec.token == SECRET
    assert again.harness.connector_spec.env == {"HF_TOKEN": SECRET + "-hf", "LEVEL": "3"}
    assert SECRET.encode() not in rd.config_path.read_bytes()
    assert SECRET.encode() not in dump_config(again).encode()  # a resume that rewrites it keeps it redacted


def test_connector_token_from_the_environment_satisfies_a_non_loopback_listener(tmp_path, monkeypatch):
    text = CONNECTOR_YAML.format(token="null").replace("transport: tcp", "transport: tcp\n    host: 0.0.0.0")
    text = text.replace("HF_TOKEN: null, ", "")
    path = write_config(tmp_path / "c.yaml", text)
    monkeypatch.delenv("POLAR_CONNECTOR_TOKEN", raising=False)
    from polar.errors import ConfigError

    with pytest.raises(ConfigError, match=r"POLAR_CONNECTOR_TOKEN"):
        load_config(path)
    monkeypatch.setenv("POLAR_CONNECTOR_TOKEN", SECRET)
    assert load_config(path).harness.connector_spec.token == SECRET


# ------------------------------------------------------------------------------------------ browsers
def test_cross_origin_post_to_ratings_is_refused(tmp_path, dashboard):
    run = agent_run_folder(tmp_path / "runs")
    srv = dashboard(tmp_path / "runs")
    body = {"kind": "session", "target": "ses-1", "score": 1, "comment": "forged"}
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        for headers in ({"origin": "http://evil.example"},
                        {"origin": "null"},  # a sandboxed iframe or a file:// page
                        {"origin": srv.url, "sec-fetch-site": "cross-site"},
                        {"origin": "http://127.0.0.1:1"}):  # another local service's page
            r = http.post("/api/ratings", params={"run": "agent"}, json=body, headers=headers)
            assert r.status_code == 403 and "cross-origin" in r.json()["error"], (headers, r.text)
        assert not (run / "ratings.jsonl").exists()
        own = http.post("/api/ratings", params={"run": "agent"}, json=body,
                        headers={"origin": srv.url, "sec-fetch-site": "same-origin"})
        assert own.status_code == 200, own.text  # the dashboard's own page still rates
    assert len((run / "ratings.jsonl").read_text().splitlines()) == 1


def test_dns_rebinding_host_is_refused(tmp_path, dashboard):
    agent_run_folder(tmp_path / "runs")
    srv = dashboard(tmp_path / "runs")
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        for host in (f"evil.example:{srv.port}", "evil.example", f"127.0.0.1.evil.example:{srv.port}"):
            r = http.get("/api/sessions", params={"run": "agent"}, headers={"host": host})
            assert r.status_code == 403 and "ses-1" not in r.text, (host, r.text)
            r = http.post("/api/ratings", params={"run": "agent"}, headers={"host": host, "origin": f"http://{host}"},
                          json={"kind": "session", "target": "ses-1", "score": 1, "comment": ""})
            assert r.status_code == 403
        for host in (f"127.0.0.1:{srv.port}", f"localhost:{srv.port}"):
            assert http.get("/api/sessions", params={"run": "agent"}, headers={"host": host}).status_code == 200


def test_symlinked_run_folder_outside_the_runs_folder_is_refused(tmp_path, dashboard):
    outside = tmp_path / "outside"
    victim = RunDir.create("victim", run_dir=outside / "victim", kind="ppo").path
    (victim / "metrics.jsonl").write_text(json.dumps({"env_steps": 1, "leak": 7}) + "\n")
    (outside / "passwd").write_text("root:TOP-SECRET-LINE:0:0\n" * 3)
    runs = tmp_path / "runs"
    good = agent_run_folder(runs, "good")
    (runs / "linked").symlink_to(victim, target_is_directory=True)
    (good / "metrics.jsonl").symlink_to(outside / "passwd")  # a file inside a run, linked out
    (good / "logs").mkdir()
    (good / "logs" / "x.jsonl").symlink_to(outside / "passwd")
    srv = dashboard(runs)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        ids = [r["id"] for r in http.get("/api/runs").json()["runs"]]
        assert ids == ["good"], ids
        for path in ("/api/keys?run=linked", "/api/curves?run=linked&keys=leak", "/files/linked/metrics.jsonl"):
            r = http.get(path)
            assert r.status_code in (403, 404) and "leak" not in r.text, (path, r.text)
        for path in ("/api/keys?run=good", "/api/curves?run=good&keys=env_steps", "/api/logs?run=good&q=root",
                     "/files/good/metrics.jsonl"):
            r = http.get(path)
            assert "TOP-SECRET" not in r.text, (path, r.text)


@pytest.mark.parametrize("name, content", [
    ("evil.html", "<html><script>fetch('/api/ratings?run=agent',{method:'POST'})</script></html>"),
    ("evil.svg", '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(document.cookie)</script></svg>'),
    ("notes.txt", "<html><script>alert(1)</script></html>"),  # sniffed as HTML without nosniff
])
def test_html_and_svg_user_files_come_back_as_attachments_with_csp(tmp_path, dashboard, name, content):
    run = agent_run_folder(tmp_path / "runs")
    (run / name).write_text(content)
    srv = dashboard(tmp_path / "runs")
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        r = http.get(f"/files/agent/{name}")
    assert r.status_code == 200 and r.text == content
    assert r.headers["content-disposition"].startswith("attachment"), r.headers
    assert r.headers["x-content-type-options"] == "nosniff"
    csp = r.headers["content-security-policy"]
    assert "sandbox" in csp and "default-src 'none'" in csp
    assert not r.headers["content-type"].startswith(("text/html", "image/svg"))


def test_non_loopback_dashboard_host_without_token_is_refused(tmp_path, dashboard):
    agent_run_folder(tmp_path / "runs")
    env = {"POLAR_DASHBOARD_TOKEN": ""}
    res = polar("dashboard", tmp_path / "runs", "--host", "0.0.0.0", "--port", "0", cwd=tmp_path, env=env,
                timeout_s=60)
    assert res.returncode == 1, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--host 0.0.0.0 is not a loopback address" in lines[0], res.stderr
    assert "POLAR_DASHBOARD_TOKEN" in lines[0]


def test_a_tokened_dashboard_off_loopback_needs_the_token_for_every_read(tmp_path):
    """What `--host 0.0.0.0` with a token serves (built as DashboardServer builds it, served on 127.0.0.1):
    nothing without the token; the browser logs in once with ?token= and gets an HttpOnly cookie."""
    from polar.dashboard.app import build_app
    from polar.httpserver import ThreadedUvicorn, bind, uvicorn_config

    agent_run_folder(tmp_path / "runs")
    app = build_app(tmp_path / "runs", SECRET, allowed_hosts=None, token_for_reads=True)
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    uv = ThreadedUvicorn(uvicorn_config(app, server_name="dashboard", log_config=None), sock, "dashboard-token-test")
    assert uv.start(30.0), "the dashboard app did not start"
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            for path in ("/api/runs", "/api/sessions?run=agent", "/files/agent/run.json"):
                r = http.get(path)
                assert r.status_code == 401 and "ses-1" not in r.text, (path, r.text)
            assert http.get("/api/runs", headers={"x-polar-token": "wrong"}).status_code == 401
            assert http.get("/api/runs", headers={"authorization": f"Bearer {SECRET}"}).status_code == 200
            login = http.get("/", params={"token": SECRET}, follow_redirects=False)
            assert login.status_code == 303 and "httponly" in login.headers["set-cookie"].lower()
            assert "samesite=strict" in login.headers["set-cookie"].lower()
            assert http.get("/api/sessions", params={"run": "agent"}).status_code == 200  # the cookie
    finally:
        uv.stop(10.0)
        sock.close()


# ------------------------------------------------------------------------------------------ run folders are data
MARKER_AGENT = '''
import os
from pathlib import Path
Path(os.environ["POLAR_TEST_MARKER"]).write_text("imported")  # what hostile code would do: anything
from polar.models.actor_critic import ActorCriticAgent as Agent
'''


@pytest.fixture
def foreign_run(tmp_path):
    """A run folder from somewhere else whose config names a module next to it that writes a marker file
    when imported; it has a checkpoint, so without the check every command would get as far as importing it."""
    src = tmp_path / "from-elsewhere"
    src.mkdir()
    (src / "marker_agent.py").write_text(MARKER_AGENT)
    cfg_path = write_config(src / "c.yaml", "name: foreign\nharness: {type: gymnasium, id: CartPole-v1}\n"
                            "agent: {type: custom, module: marker_agent, class_name: Agent}\npolicy: {type: ppo}\n")
    cfg = load_config(cfg_path)
    rd = RunDir.create("foreign", run_dir=tmp_path / "run", kind="ppo", config_dir=src)
    rd.write_config(dump_config(cfg))
    CheckpointManager(rd.checkpoints_dir).save(1, {"policy": {}, "iteration": 1, "env_steps": 16, "policy_version": 1})
    marker = tmp_path / "imported.marker"
    work = tmp_path / "work"
    work.mkdir()
    return rd.path, marker, work


@pytest.mark.parametrize("command", ["eval", "export", "serve"])
def test_reopening_a_run_that_names_a_custom_module_needs_trust_code(foreign_run, command):
    run, marker, work = foreign_run
    extra = {"eval": ["--episodes", "1"], "export": ["--out", str(work / "e")], "serve": ["--port", "0"]}[command]
    res = polar(command, run, *extra, cwd=work, env={"POLAR_TEST_MARKER": str(marker)})
    assert res.returncode == 1, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "agent.module = 'marker_agent'" in lines[0] and "--trust-code" in lines[0], res.stderr
    assert not marker.exists(), "the run's module was imported before the refusal"


def test_an_eval_suite_naming_a_foreign_run_needs_trust_code(foreign_run, monkeypatch):
    from polar.errors import ConfigError
    from polar.evaluation.runner import run_suite
    from polar.evaluation.suite import load_suite

    run, marker, work = foreign_run
    monkeypatch.setenv("POLAR_TEST_MARKER", str(marker))
    (work / "s.yaml").write_text(yaml.safe_dump({
        "name": "s", "policies": [{"name": "a", "run": str(run)}],
        "harnesses": [{"name": "c", "harness": {"type": "gymnasium", "id": "CartPole-v1"},
                       "seeds": {"start": 10**6, "count": 1}}]}))
    with pytest.raises(ConfigError, match=r"policy 'a': run .* names code .*agent\.module.*--trust-code"):
        run_suite(load_suite(work / "s.yaml"), work / "out")
    assert not marker.exists() and not (work / "out" / "report.json").exists()
    # a harness taken from the run folder's own config file is the run's data too, not the suite author's YAML
    own_cfg = load_config(write_config(work / "own.yaml", "name: own\nharness: {type: gymnasium, id: CartPole-v1}\n"
                                       "policy: {type: ppo}\n"))
    own = RunDir.create("own", run_dir=work / "own", kind="ppo").path
    (own / "config.resolved.yaml").write_text(dump_config(own_cfg))
    (work / "h.yaml").write_text(yaml.safe_dump({
        "name": "h", "policies": [{"name": "own", "run": str(own)}],
        "harnesses": [{"name": "c", "config": str(run / "config.resolved.yaml"), "seeds": {"start": 10**6, "count": 1}}]}))
    with pytest.raises(ConfigError, match=r"harness 'c': run .* names code .*agent\.module.*--trust-code"):
        run_suite(load_suite(work / "h.yaml"), work / "out2")
    assert not marker.exists()


def crafted_torchscript(export_dir: Path, victim: Path, stolen: Path) -> None:
    """Replace a genuine TorchScript export's model by a program with the same inputs and outputs that reads
    ``stolen`` (its first bytes come back as the value output) and overwrites ``victim`` through a shared
    memory map: what a TorchScript file can do when it is run."""
    code = f'''
import torch
from typing import Tuple

class Evil(torch.nn.Module):
    def forward(self, obs: torch.Tensor, noise: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        w = torch.from_file({str(victim)!r}, True, 8, dtype=torch.uint8)
        w.fill_(88)
        r = torch.from_file({str(stolen)!r}, False, 8, dtype=torch.uint8)
        b = obs.shape[0]
        value = r[:1].float().expand(b) + w[:1].float() * 0
        return torch.zeros([b], dtype=torch.long), torch.zeros([b, 2]), value
'''
    ns: dict = {}
    src = export_dir / "evil_src.py"
    src.write_text(code)
    exec(compile(code, str(src), "exec"), ns)  # the attacker's build step, in the test
    torch.jit.script(ns["Evil"]()).save(str(export_dir / "model.ts"))
    src.unlink()


def test_crafted_torchscript_is_refused_without_trust(tmp_path):
    from polar.deploy.export import export_run
    from polar.errors import DeployError
    from tests.deploy.conftest import run_config, write_run
    from tests.deploy.serving import LiveServer

    run = write_run(tmp_path / "run", run_config("cartpole"))
    export = tmp_path / "models" / "cartpole" / "1"
    export_run(run.path, export, "torchscript", samples=8)
    victim, stolen = tmp_path / "victim.txt", tmp_path / "server-secret.txt"
    victim.write_text("precious server file")
    stolen.write_text("SECRETS!")
    crafted_torchscript(export, victim, stolen)
    from polar.deploy.serve import ServeSettings, make_server

    with pytest.raises(DeployError, match=r"no version in .* loads: .* is a TorchScript export: TorchScript is a "
                                          r"program .* --trust-code"):
        asyncio.run(make_server(export.parent, ServeSettings(poll_s=0)).start())
    assert victim.read_text() == "precious server file"
    res = polar("serve", export.parent, "--port", "0", cwd=tmp_path)
    assert res.returncode == 1 and "TorchScript is a program" in res.stderr and "--trust-code" in res.stderr
    assert victim.read_text() == "precious server file"
    # the same file under --trust-code does what it was built to do: the flag is what stands in the way
    with LiveServer(export.parent, poll_s=0, trust_code=True) as s:
        r = s.client.post("/v1/act", json={"observation": [0.0, 0.0, 0.0, 0.0]})
        assert r.json()["value"] == float(ord("S"))
    assert victim.read_text().startswith("XXXXXXXX")


# ------------------------------------------------------------------------------------------ polar serve
@pytest.fixture(scope="module")
def cartpole_models(tmp_path_factory):
    from polar.deploy.export import export_run
    from tests.deploy.conftest import run_config, write_run

    root = tmp_path_factory.mktemp("serve")
    run = write_run(root / "run", run_config("cartpole"))
    export_run(run.path, root / "models" / "acrobot" / "30", samples=8)  # folder name and version differ
    return root / "models" / "acrobot"


def test_chunked_20_mib_body_is_refused_before_it_is_read_whole(cartpole_models):
    from tests.deploy.serving import LiveServer

    chunk = b"[" + b"0," * (32 * 1024) + b"0]"  # ~64 KiB of JSON text per chunk
    with LiveServer(cartpole_models, poll_s=0) as s:
        host, port = s.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"POST /v1/act HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            sent = 0
            while sent <= 16 * 1024 * 1024:  # just past the limit; the other 4 MiB of the 20 are never sent
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
            sock.settimeout(15)  # a server that waits for the whole body never answers
            reply = b""
            while b"\r\n\r\n" not in reply:
                data = sock.recv(65536)
                if not data:
                    break
                reply += data
        assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
        assert s.client.get("/v2/health/ready").status_code == 200  # and it serves the others meanwhile


def test_a_huge_body_does_not_stall_other_requests(cartpole_models):
    """A 14 MiB body (520,000 observations) costs about a second of JSON parsing and list conversion, which
    holds Python's GIL: done in the server's process it stops every other request for that second. Health
    checks sent meanwhile must each be answered within 0.5 s."""
    from tests.deploy.serving import LiveServer

    body = json.dumps({"observations": [[0.123456, 0.5, 0.25, 0.75]] * 520_000}).encode()
    with LiveServer(cartpole_models, poll_s=0) as s:
        r = s.client.post("/v1/act", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "max_batch_size" in r.text  # warm: the parser's worker has started
        latencies: list[float] = []
        done = threading.Event()

        def probe() -> None:
            with httpx.Client(base_url=s.url, timeout=30) as c:
                while not done.is_set():
                    t0 = time.perf_counter()
                    assert c.get("/v2/health/live").status_code == 200
                    latencies.append(time.perf_counter() - t0)
                    time.sleep(0.005)

        t = threading.Thread(target=probe)
        t.start()
        try:
            time.sleep(0.2)
            for _ in range(2):
                r = s.client.post("/v1/act", content=body, headers={"content-type": "application/json"})
                assert r.status_code == 413, r.text
            time.sleep(0.2)
        finally:
            done.set()
            t.join(30)
    assert len(latencies) > 20 and max(latencies) < 0.5, (len(latencies), max(latencies))


BAD_BODIES = {
    "nan": ('{"observation": [NaN, 0, 0, 0]}', "NaN"),
    "infinity": ('{"observation": [Infinity, 0, 0, 0]}', "Infinity"),
    "overflow_to_inf": ('{"observation": [1e400, 0, 0, 0]}', "NaN, infinity or a number too large"),
    "float32_overflow": ('{"observation": [1e39, 0, 0, 0]}', "NaN, infinity or a number too large"),
    "deep_nesting": ('{"observation": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests too deeply"),
    "nested_40": ('{"observation": ' + "[" * 40 + "0" + "]" * 40 + "}", "nests lists more than 32 deep"),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_nan_inf_and_deep_nesting_get_4xx(cartpole_models, case):
    from tests.deploy.serving import LiveServer

    body, why = BAD_BODIES[case]
    with LiveServer(cartpole_models, poll_s=0, name="acrobot") as s:
        r = s.client.post("/v1/act", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and why in r.json()["error"], r.text
        oip = body.replace('{"observation": ', '{"inputs": [{"name": "obs", "shape": [1, 4], "datatype": "FP32", '
                                               '"data": ', 1) + "]}"
        r = s.client.post("/v2/models/acrobot/infer", content=oip, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500, r.text


@pytest.mark.parametrize("shape, data", [([2**62, 4], []),  # 2**64 values: wraps to 0 in int64
                                         ([2**62 + 1, 4], [0.0] * 4)])  # wraps to 4: four values "fit"
def test_overflowing_shapes_get_4xx(cartpole_models, shape, data):
    from tests.deploy.serving import LiveServer

    with LiveServer(cartpole_models, poll_s=0, name="acrobot") as s:
        r = s.client.post("/v2/models/acrobot/infer",
                          json={"inputs": [{"name": "obs", "shape": shape, "datatype": "FP32", "data": data}]})
        assert 400 <= r.status_code < 500 and "error" in r.json(), r.text


@pytest.mark.parametrize("agent", ["mlp", "lstm"])
def test_metadata_inputs_are_exactly_what_infer_accepts(cartpole_models, tmp_path, agent):
    """A generic OIP client: read the model's metadata, send one tensor for every input it declares."""
    from polar.deploy.export import export_run
    from tests.deploy.conftest import run_config, write_run
    from tests.deploy.serving import LiveServer

    models = cartpole_models
    if agent == "lstm":  # its recurrent state inputs are declared too, and accepted
        run = write_run(tmp_path / "run", run_config("cartpole", agent={"type": "lstm", "hidden_sizes": [16],
                                                                        "lstm_hidden_size": 8}))
        export_run(run.path, tmp_path / "models" / "acrobot" / "1", samples=8)
        models = tmp_path / "models" / "acrobot"
    with LiveServer(models, poll_s=0, name="acrobot") as s:
        meta = s.client.get("/v2/models/acrobot").json()
        want = ["obs"] if agent == "mlp" else ["obs", "state.0", "state.1"]
        assert [t["name"] for t in meta["inputs"]] == want
        inputs = []
        for t in meta["inputs"]:
            shape = [1 if d == -1 else d for d in t["shape"]]
            n = 1
            for d in shape:
                n *= d
            inputs.append({"name": t["name"], "shape": shape, "datatype": t["datatype"], "data": [0] * n})
        r = s.client.post(f"/v2/models/{meta['name']}/infer", json={"inputs": inputs})
        assert r.status_code == 200, r.text
        assert {o["name"] for o in r.json()["outputs"]} == {t["name"] for t in meta["outputs"]}


def test_served_name_and_version_follow_the_model_repository_layout(cartpole_models):
    from tests.deploy.serving import LiveServer

    with LiveServer(cartpole_models, poll_s=0) as s:  # models/acrobot/ holding 30/
        meta = s.client.get("/v2/models/acrobot").json()
        assert meta["name"] == "acrobot" and meta["versions"] == ["30"]
    with LiveServer(cartpole_models / "30", poll_s=0) as s:  # the version folder itself
        r = s.client.post("/v2/models/acrobot/versions/30/infer", json={"inputs": [
            {"name": "obs", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]})
        assert r.status_code == 200 and r.json()["model_version"] == "30", r.text


def test_non_loopback_serve_host_without_token_is_refused(cartpole_models, tmp_path):
    res = polar("serve", cartpole_models, "--host", "0.0.0.0", "--port", "0", cwd=tmp_path,
                env={"POLAR_SERVE_TOKEN": ""}, timeout_s=60)
    assert res.returncode == 1, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--host 0.0.0.0 is not a loopback address" in lines[0], res.stderr
    assert "POLAR_SERVE_TOKEN" in lines[0]


def test_serve_token_guards_every_route_but_health(cartpole_models):
    from tests.deploy.serving import LiveServer

    with LiveServer(cartpole_models, poll_s=0, token=SECRET) as s:
        assert s.client.get("/v2/health/ready").status_code == 200
        body = {"observation": [0, 0, 0, 0]}
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": SECRET}):
            assert s.client.post("/v1/act", json=body, headers=headers).status_code == 401
            assert s.client.get("/v2/models/acrobot", headers=headers).status_code == 401
        assert s.client.post("/v1/act", json=body, headers={"authorization": f"Bearer {SECRET}"}).status_code == 200


def test_a_rebinding_host_cannot_query_polar_serve(cartpole_models, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "polar.cli.main", "serve", str(cartpole_models), "--port", "0"],
                            cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = proc.stderr.readline()
        url = line.split(" on ")[1].split()[0]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        port = url.rsplit(":", 1)[1]
        body = {"observation": [0, 0, 0, 0]}
        r = httpx.post(f"{url}/v1/act", json=body, headers={"host": f"evil.example:{port}"}, timeout=10)
        assert r.status_code == 403 and "Host" in r.json()["error"], r.text
        assert httpx.get(f"{url}/v2/models/acrobot", headers={"host": f"evil.example:{port}"}).status_code == 403
        assert httpx.post(f"{url}/v1/act", json=body, headers={"host": f"localhost:{port}"}).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)


def test_serve_banner_prints_the_address_it_listens_on(cartpole_models, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "polar.cli.main", "serve", str(cartpole_models), "--port", "0"],
                            cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = proc.stderr.readline()
        assert line.startswith("polar serve:") and "http://127.0.0.1:" in line, line
        port = int(line.split("http://127.0.0.1:")[1].split()[0])
        assert port != 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise AssertionError("the announced address never answered")
    finally:
        proc.terminate()
        proc.wait(30)


# ------------------------------------------------------------------------------------------ in a real browser
@pytest.fixture
def chromium_page():
    """Headless Chromium (Debian's, as tests/dashboard uses) where the name evil.test resolves to 127.0.0.1,
    as it does for a victim after an attacker re-points its DNS record (rebinding)."""
    from playwright.sync_api import sync_playwright

    from tests.dashboard.conftest import chromium_path

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(),
                              args=["--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP evil.test 127.0.0.1"])
        ctx = b.new_context()
        yield ctx.new_page()
        ctx.close()
        b.close()


class _EvilSite:
    """Another site on this machine (another origin): serves one page."""

    def __init__(self, html: str) -> None:
        import http.server

        page = html.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_web_page_of_another_site_cannot_forge_a_dashboard_rating(tmp_path, dashboard, chromium_page):
    """The CSRF attack as a browser makes it: a page of another origin POSTs to the dashboard (no-cors, a
    'simple' request that needs no preflight, so the browser sends it)."""
    run = agent_run_folder(tmp_path / "runs")
    srv = dashboard(tmp_path / "runs")
    target = f"{srv.url}/api/ratings?run=agent"
    evil = _EvilSite(f"""<script>
      window.sent = fetch({json.dumps(target)}, {{method: "POST", mode: "no-cors", headers: {{"content-type": "text/plain"}},
        body: JSON.stringify({{kind: "session", target: "ses-1", score: 1, comment: "forged"}})}})
        .then(() => "sent", (e) => "error " + e);
    </script>""")
    try:
        chromium_page.goto(evil.url)
        assert chromium_page.evaluate("window.sent") == "sent"  # the browser did send it
        time.sleep(0.5)
    finally:
        evil.close()
    assert not (run / "ratings.jsonl").exists(), (run / "ratings.jsonl").read_text()


def test_a_rebinding_page_cannot_read_the_dashboard(tmp_path, dashboard, chromium_page):
    """After rebinding, evil.test is 127.0.0.1: the attacker's page is same-origin with http://evil.test:PORT,
    the browser sends Host: evil.test:PORT, and the dashboard must answer nothing."""
    agent_run_folder(tmp_path / "runs")
    srv = dashboard(tmp_path / "runs")
    resp = chromium_page.goto(f"http://evil.test:{srv.port}/api/sessions?run=agent")
    assert resp is not None and resp.status == 403
    assert "ses-1" not in chromium_page.content()
    resp = chromium_page.goto(f"http://127.0.0.1:{srv.port}/api/sessions?run=agent")  # the real address works
    assert resp is not None and resp.status == 200 and "ses-1" in chromium_page.content()


# ------------------------------------------------------------------------------------------ resume, end to end
def test_polar_resume_of_a_run_with_redacted_secrets_takes_them_from_the_environment(tmp_path):
    """`polar run` a connector run whose token comes from $POLAR_CONNECTOR_TOKEN and whose connector env holds
    an API key; neither reaches the run folder; `polar resume` stops with one line naming the missing one,
    then finishes once the environment supplies it (the connector's hello uses the re-supplied token)."""
    import shutil

    src = ROOT / "examples" / "keydoor"
    game = tmp_path / "game"
    game.mkdir()
    for f in ("keydoor_game.py", "my_game_connector.py", "polar_agent_definition.py"):
        shutil.copy(src / f, game / f)
    api_key = "key-" + "9d1e-never-on-disk"
    cfg = yaml.safe_load((src / "demo.yaml").read_text())
    cfg["harness"]["connector_spec"]["env"] = {"GAME_API_KEY": api_key}
    cfg["total_env_steps"] = 1024
    cfg["distribution"]["envs_per_worker"] = 4
    cfg["logging"] = {"checkpoint_freq": 1, "tensorboard": False, "progress_bar": False}
    cfg["eval"] = {"at_end": False}
    (game / "c.yaml").write_text(yaml.safe_dump(cfg))
    env = {"POLAR_CONNECTOR_TOKEN": SECRET, "GAME_API_KEY": ""}
    run = tmp_path / "run"
    first = polar("run", "--config", game / "c.yaml", "--run-dir", run, "--no-progress", cwd=tmp_path, env=env,
                  timeout_s=600)
    assert first.returncode == 0, first.stderr[-3000:]
    for f in run.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert SECRET.encode() not in data and api_key.encode() not in data, f
    assert "<redacted>" in (run / "config.resolved.yaml").read_text()
    missing = polar("resume", run, "-o", "total_env_steps=2048", "--no-progress", cwd=tmp_path, env=env)
    assert missing.returncode == 1
    lines = [ln for ln in missing.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "harness.connector_spec.env.GAME_API_KEY was redacted" in lines[0], missing.stderr
    assert "$GAME_API_KEY" in lines[0]
    again = polar("resume", run, "-o", "total_env_steps=2048", "--no-progress", cwd=tmp_path,
                  env={**env, "GAME_API_KEY": api_key}, timeout_s=600)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] >= 2048
    for f in run.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert SECRET.encode() not in data and api_key.encode() not in data, f
