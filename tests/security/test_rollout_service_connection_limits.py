"""The rollout service (``RolloutServer``: the run's session API, which every gateway node and the local stack
talk to) holds the gateway's connection limits (polar.httpserver): an agent program on the host that finds its
port and drips headers (slowloris), or opens sockets and leaves them idle, is cut, and the service answers
others throughout. Real server on 127.0.0.1, attacked with raw sockets."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from polar.harness.agent.runners import CallableRunner
from polar.harness.agent.verifiers import NoVerifier
from polar.httpserver import ConnectionLimits
from polar.rollout.sessions.local import RolloutServer
from polar.rollout.sessions.pipeline import PipelineSettings
from tests.agentic.helpers import HERE


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server closed ``sock``: reads what is left of an answer, then EOF (or a reset)."""
    try:
        for _ in range(64):
            if sock.recv(65536) == b"":
                return True
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True
    except (BlockingIOError, TimeoutError):
        return False


def _health(server: RolloutServer) -> int:
    return httpx.get(f"{server.url}/health", timeout=5).status_code


@pytest.fixture
def serve(tmp_path) -> Iterator[Callable[..., RolloutServer]]:
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


def test_slowloris_dripping_headers_cannot_hold_the_rollout_service(serve):
    """With the default limits (a 10 s header deadline): a client that never finishes its headers is cut."""
    server = serve()
    deadline_s = ConnectionLimits().header_timeout_s
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        t0 = time.monotonic()
        cut_after_s = None
        for i in range(int((deadline_s + 4) / 0.25)):  # one header every 0.25 s: never finished, never idle
            try:
                sock.sendall(b"x-drip-%d: y\r\n" % i)
            except (BrokenPipeError, ConnectionResetError):
                cut_after_s = time.monotonic() - t0
                break
            sock.settimeout(0.25)
            if _closed_by_peer(sock):
                cut_after_s = time.monotonic() - t0
                break
            if i % 8 == 0:
                assert _health(server) == 200  # the others are served meanwhile
        assert cut_after_s is not None, f"a client dripping headers for {deadline_s + 4:g} s was never cut"
        assert cut_after_s < deadline_s + 2.0
    finally:
        sock.close()
    assert _health(server) == 200


def test_idle_sockets_cannot_exhaust_the_rollout_service(serve):
    """Far more idle sockets than the cap: the longest-idle ones make room, and each is closed after the
    header deadline; /health answers throughout, also a client idling on keep-alive is closed."""
    limits = ConnectionLimits(header_timeout_s=1.0, keep_alive_s=1.0, max_connections=64)
    server = serve(limits)
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(200)]
    try:
        assert _health(server) == 200
        kept = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        kept.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        idle.append(kept)
        time.sleep(limits.header_timeout_s + 1.0)
        for s in idle:
            s.settimeout(2.0)
        still_open = [i for i, s in enumerate(idle) if not _closed_by_peer(s)]
        assert still_open == [], f"{len(still_open)} idle connections were not closed: {still_open[:10]}"
        assert _health(server) == 200
    finally:
        for s in idle:
            s.close()


def test_huge_headers_to_the_rollout_service_are_refused(serve):
    """Headers past ``max_header_bytes`` get a 431 (or, when the refusal raced the client's last bytes into a
    reset, the connection closed) long before they end; never read on until the client stops."""
    server = serve(ConnectionLimits(max_header_bytes=16 * 1024))
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
            closed = closed or answer == b"" or _closed_by_peer(sock)
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            pass
    finally:
        sock.close()
    assert closed, f"the server still held a connection with {64 * 1024} bytes of unfinished headers: {answer[:200]!r}"
    assert answer == b"" or (answer.startswith(b"HTTP/1.1 431") and b"rollout service" in answer), answer[:300]
    assert _health(server) == 200
