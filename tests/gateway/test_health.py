"""``/health`` reports the engine's state and each upstream replica's, and answers 503 when the engine
cannot serve; upstream probes are bounded and cached, so ``/health`` never hangs on a dead replica."""

from __future__ import annotations

import socket

import httpx
import pytest

from polar.inference.upstream import UpstreamConfig, UpstreamEngine

GATE_FIELDS = ("inflight", "waiting", "paused")


def _closed_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_port():
    """A loopback port that accepts connections (the kernel's backlog) but never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s.getsockname()[1]
    s.close()


def _upstream(urls: list[str], **kwargs) -> UpstreamEngine:
    return UpstreamEngine(UpstreamConfig(kind="vllm", urls=urls, served_model="tiny", **kwargs))


def test_unreachable_upstream_is_unavailable_with_503(gateway):
    url = f"http://127.0.0.1:{_closed_port()}"
    gw = gateway(_upstream([url]))
    r = httpx.get(f"{gw.url}/health", timeout=30)
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "unavailable" and all(k in body for k in GATE_FIELDS)
    (replica,) = body["engine"]["replicas"]
    assert replica["url"] == url and replica["state"] == "down" and "Connect" in replica["error"]


def test_one_replica_down_is_degraded_and_probes_are_cached(gateway, embedded):
    from polar.testing.standin import StandinServer, make_app

    dead = f"http://127.0.0.1:{_closed_port()}"
    with StandinServer(make_app(embedded, "vllm")) as live:
        gw = gateway(_upstream([live.url, dead], health_ttl_s=600))
        answers = [httpx.get(f"{gw.url}/health", timeout=30) for _ in range(5)]
        probes = live.app.state.standin.health_calls
    assert [a.status_code for a in answers] == [200] * 5
    body = answers[-1].json()
    assert body["status"] == "degraded" and body["inflight"] == 0
    states = {r["url"]: r["state"] for r in body["engine"]["replicas"]}
    assert states == {live.url: "ok", dead: "down"}
    assert probes == 1  # five /health calls within the TTL: one probe of the replica


def test_a_replica_that_never_answers_is_down_within_the_probe_timeout(gateway, silent_port):
    gw = gateway(_upstream([f"http://127.0.0.1:{silent_port}"], health_timeout_s=0.5))
    # the client's 30 s budget is far above the 0.5 s probe timeout: an unbounded probe would hang it
    r = httpx.get(f"{gw.url}/health", timeout=30)
    assert r.status_code == 503
    (replica,) = r.json()["engine"]["replicas"]
    assert replica["state"] == "down" and "within 0.5s" in replica["error"]


def test_embedded_engine_is_ok_until_closed(gateway, embedded):
    gw = gateway(embedded)
    r = httpx.get(f"{gw.url}/health", timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["engine"]["state"] == "ok"
    gw.call(embedded.close())
    r = httpx.get(f"{gw.url}/health", timeout=30)
    assert r.status_code == 503 and r.json()["engine"] == {"state": "unavailable", "error": "engine is closed"}
