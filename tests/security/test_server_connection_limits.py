"""Every server polar starts holds the gateway's connection limits (polar.httpserver): ``polar serve`` and
``polar dashboard`` as real processes on 127.0.0.1, and the rollout service (``RolloutServer``) in-process,
attacked with raw sockets: a slowloris client dripping headers is cut after the header deadline (10 s), a
100 MB header gets a 431 (or the connection closed) long before it is read whole, an idle connection and an
idle keep-alive connection are closed, and the server answers others throughout."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from polar.harness.agent.runners import CallableRunner
from polar.harness.agent.verifiers import NoVerifier
from polar.httpserver import ConnectionLimits
from polar.rollout.sessions.local import RolloutServer
from polar.rollout.sessions.pipeline import PipelineSettings
from tests.agent_support.helpers import HERE
from tests.security.rawsocket import closed_by_peer, drip_body, drip_headers, huge_header

ROOT = Path(__file__).resolve().parents[2]
HEADER_TIMEOUT_S = 10.0  # polar.httpserver.ConnectionLimits defaults, which both servers keep
KEEP_ALIVE_S = 5.0
MAX_HEADER_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    from polar.deploy.export import export_run
    from tests.deploy.conftest import run_config, write_run

    root = tmp_path_factory.mktemp("limits")
    run = write_run(root / "run", run_config("cartpole"))
    export_run(run.path, root / "models" / "cartpole" / "1", samples=8)
    return root / "models" / "cartpole"


def _start(args: list[str], pattern: str, cwd: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "polar.cli.main", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(pattern, line)
        if m:
            return proc, int(m.group(1))
    proc.kill()
    raise AssertionError(f"{args[0]} never announced its address: {proc.stdout.read()[-2000:]}")


@pytest.fixture(scope="module", params=["serve", "dashboard"])
def server(request, exported, tmp_path_factory) -> Iterator[tuple[int, str]]:
    """(port, a path answering 200) of a real ``polar serve`` / ``polar dashboard`` process, one of each for the
    module (a start costs seconds): every attack on it ends by checking that it still serves."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    if request.param == "serve":
        proc, port = _start(["serve", str(exported), "--port", "0"], r"on http://127\.0\.0\.1:(\d+)", tmp_path)
        health = "/v2/health/live"
    else:
        (tmp_path / "runs").mkdir()
        proc, port = _start(["dashboard", str(tmp_path / "runs"), "--port", "0"], r"at http://127\.0\.0\.1:(\d+)/",
                            tmp_path)
        health = "/"
    try:
        deadline = time.monotonic() + 60
        while _status(port, health) != 200:
            assert time.monotonic() < deadline and proc.poll() is None, "the server never answered"
            time.sleep(0.1)
        yield port, health
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _status(port: int, path: str) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).status_code
    except httpx.HTTPError:
        return None


def test_slowloris_and_idle_connections_are_cut(server):
    """One client drips a header every 0.2 s (never finishing), one connects and sends nothing, one idles on
    keep-alive after a request: all three are closed by the deadlines, while others are served."""
    port, health = server
    drip = socket.create_connection(("127.0.0.1", port), timeout=5)
    idle = socket.create_connection(("127.0.0.1", port), timeout=5)
    kept = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        kept.sendall(b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % health.encode())
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        drip.sendall(b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n" % health.encode())
        t0 = time.monotonic()
        closed: dict[str, float] = {}
        for i in range(int((HEADER_TIMEOUT_S + 5) / 0.2)):
            if "drip" not in closed:
                try:
                    drip.sendall(b"x-drip-%d: y\r\n" % i)
                except (BrokenPipeError, ConnectionResetError):
                    closed["drip"] = time.monotonic() - t0
            for name, sock in (("drip", drip), ("idle", idle), ("kept", kept)):
                sock.settimeout(0.05)
                if name not in closed and closed_by_peer(sock):
                    closed[name] = time.monotonic() - t0
            if len(closed) == 3:
                break
            if i % 10 == 0:
                assert _status(port, health) == 200  # the others are served meanwhile
            time.sleep(0.15)
        assert set(closed) == {"drip", "idle", "kept"}, f"still open after {HEADER_TIMEOUT_S + 5:g} s: {closed}"
        assert closed["drip"] < HEADER_TIMEOUT_S + 2 and closed["idle"] < HEADER_TIMEOUT_S + 2
        assert closed["kept"] < KEEP_ALIVE_S + 2, closed
        assert _status(port, health) == 200
    finally:
        for s in (drip, idle, kept):
            s.close()


def test_hundred_megabyte_header_is_refused_quickly(server):
    port, health = server
    sent, answer, elapsed_s = huge_header(port, health)
    assert sent < 100 * 1024 * 1024, "all 100 MB of one header were read"
    assert sent <= 64 * MAX_HEADER_BYTES, f"{sent} bytes of header were read before the cut"
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer[:300]
    assert elapsed_s < 15
    assert _status(port, health) == 200


def test_a_dripped_body_to_polar_serve_gets_a_408(exported):
    from tests.deploy.serving import LiveServer

    with LiveServer(exported, poll_s=0, body_timeout_s=1.0) as s:
        port = int(s.url.rsplit(":", 1)[1])
        answer, elapsed_s = drip_body(port, b"POST /v1/act HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json"
                                             b"\r\ncontent-length: 100000\r\n\r\n{\"observation\": ", 8)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b"did not arrive within 1 s" in answer and elapsed_s < 4
        assert s.client.get("/v2/health/live").status_code == 200


def test_a_dripped_or_huge_rating_body_is_cut(tmp_path, monkeypatch):
    """The dashboard's one write: a rating body dripped a byte at a time gets a 408, a huge one a 413 as soon
    as it passes the limit (it used to be read whole, whatever its size, before anything was said)."""
    import polar.dashboard.app as dashboard_app
    from polar.dashboard.server import DashboardServer
    from polar.trainers.run_dir import RunDir

    monkeypatch.setattr(dashboard_app, "BODY_TIMEOUT_S", 1.0)
    RunDir.create("agent", run_dir=tmp_path / "runs" / "agent", kind="agentic-grpo")
    srv = DashboardServer(tmp_path / "runs").start()
    try:
        head = (b"POST /api/ratings?run=agent HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n{\"kind\": ")
        answer, elapsed_s = drip_body(srv.port, head % 1000, 8)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b"did not arrive within 1 s" in answer and elapsed_s < 4
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        sent = 0
        try:
            sock.sendall(b"POST /api/ratings?run=agent HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json"
                         b"\r\ntransfer-encoding: chunked\r\n\r\n")
            chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
            while sent <= 4 * dashboard_app.RATING_BODY_BYTES:  # past the limit; the body's end never comes
                sock.sendall(chunk)
                sent += 65536
            sock.settimeout(10)  # a server that waits for the whole body never answers
            reply = b""
            with contextlib.suppress(TimeoutError, ConnectionResetError):
                while not reply.endswith(b"}"):
                    got = sock.recv(65536)
                    if not got:
                        break
                    reply += got
        finally:
            sock.close()
        assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
        assert b"the rating is over the limit" in reply
        assert _status(srv.port, "/") == 200
    finally:
        srv.stop()


# ---- the rollout service (RolloutServer, in-process): the run's session API every gateway node and the local
# stack talk to; an agent program on the host that finds its port must not hold it either

def _rollout_health(server: RolloutServer) -> int:
    return httpx.get(f"{server.url}/health", timeout=5).status_code


@pytest.fixture
def rollout_service(tmp_path) -> Iterator[Callable[..., RolloutServer]]:
    started: list[RolloutServer] = []

    def start(limits: ConnectionLimits | None = None) -> RolloutServer:
        settings = PipelineSettings(workspace_root=str(tmp_path / "ws"), model_name="tiny")
        kwargs: dict[str, ConnectionLimits] = {} if limits is None else {"limits": limits}
        server = RolloutServer(CallableRunner("agents_for_tests:calc_or_stall", HERE), NoVerifier(), settings,
                               **kwargs).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def test_slowloris_dripping_headers_cannot_hold_the_rollout_service(rollout_service):
    """With the default limits (a 10 s header deadline): a client that never finishes its headers is cut."""
    server = rollout_service()
    deadline_s = ConnectionLimits().header_timeout_s

    def served() -> None:
        assert _rollout_health(server) == 200  # the others are served meanwhile

    # one header every 0.25 s: never finished, never idle
    cut_after_s = drip_headers(server.port, "/health", interval_s=0.25, budget_s=deadline_s + 4, served=served,
                               check_every=8)
    assert cut_after_s is not None, f"a client dripping headers for {deadline_s + 4:g} s was never cut"
    assert cut_after_s < deadline_s + 2.0
    assert _rollout_health(server) == 200


def test_idle_sockets_cannot_exhaust_the_rollout_service(rollout_service):
    """Far more idle sockets than the cap: the longest-idle ones make room, and each is closed after the
    header deadline; /health answers throughout, also a client idling on keep-alive is closed."""
    limits = ConnectionLimits(header_timeout_s=1.0, keep_alive_s=1.0, max_connections=64)
    server = rollout_service(limits)
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(200)]
    try:
        assert _rollout_health(server) == 200
        kept = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        kept.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        idle.append(kept)
        time.sleep(limits.header_timeout_s + 1.0)
        for s in idle:
            s.settimeout(2.0)
        still_open = [i for i, s in enumerate(idle) if not closed_by_peer(s)]
        assert still_open == [], f"{len(still_open)} idle connections were not closed: {still_open[:10]}"
        assert _rollout_health(server) == 200
    finally:
        for s in idle:
            s.close()


def test_huge_headers_to_the_rollout_service_are_refused(rollout_service):
    """Headers past ``max_header_bytes`` get a 431 (or, when the refusal raced the client's last bytes into a
    reset, the connection closed) long before they end; never read on until the client stops."""
    server = rollout_service(ConnectionLimits(max_header_bytes=16 * 1024))
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    answer, closed = b"", False
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        for _ in range(64):  # 64 x 1 KiB headers, 4x the limit, and never the blank line that ends them
            try:
                sock.sendall(b"x-big: " + b"a" * 1024 + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
        sock.settimeout(5)
        try:
            answer = sock.recv(65536)
            closed = closed or answer == b"" or closed_by_peer(sock)
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            pass
    finally:
        sock.close()
    assert closed, f"the server still held a connection with {64 * 1024} bytes of unfinished headers: {answer[:200]!r}"
    assert answer == b"" or (answer.startswith(b"HTTP/1.1 431") and b"rollout service" in answer), answer[:300]
    assert _rollout_health(server) == 200


def test_a_huge_body_to_the_rollout_service_is_cut_while_it_streams(rollout_service):
    """A token holder's chunked body that never ends gets a 413 as soon as it passes 16 MiB (it used to be read
    whole before its size was looked at, so a body that never ended held the connection and its memory)."""
    server = rollout_service()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sent, reply = 0, b""
    try:
        auth = server.headers["authorization"].encode()
        sock.sendall(b"POST /tasks HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                     b"authorization: " + auth + b"\r\ntransfer-encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            while sent <= 20 << 20:  # past the 16 MiB limit; the body's end never comes
                sock.sendall(chunk)
                sent += 65536
        sock.settimeout(10)  # a server that waits for the whole body never answers
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while not reply.endswith(b"}"):
                got = sock.recv(65536)
                if not got:
                    break
                reply += got
    finally:
        sock.close()
    assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
    assert b"over the limit of 16777216 bytes" in reply
    assert _rollout_health(server) == 200
