"""The replicas of one upstream service: session-sticky routing, failover cooldowns, health probes.

A request with a ``session_id`` goes to the healthy replica with the highest rendezvous hash of (session_id,
url), so a session stays on one replica (prefix-cache hits) and only sessions of a failed replica move.
Requests without one go to the replica with the fewest in-flight requests. A replica that fails a request
before streaming any token is marked down for ``cooldown_s`` and routed to last until then.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from polar.inference._http1 import Http1Pool
from polar.inference.upstream.config import UpstreamConfig


class Replica:
    """One server of the service, and what routing knows of it."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.pool: Http1Pool | None = None  # keep-alive connections for non-streamed calls (per event loop)
        self.in_flight = 0
        self.down_until = 0.0

    def healthy(self, now: float) -> bool:
        return now >= self.down_until

    def mark_down(self, cooldown_s: float) -> None:
        """It failed a call: route to it last for ``cooldown_s``."""
        self.down_until = time.monotonic() + cooldown_s

    def close_pool(self) -> None:
        if self.pool is not None:
            try:
                self.pool.close()
            except RuntimeError:  # created on an event loop that is gone
                pass
            self.pool = None


def rendezvous_hash(session_id: str, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{session_id}\x00{url}".encode(), digest_size=8).digest(), "big")


class ReplicaSet:
    """The replicas in routing order. ``admits`` (a launcher's: the replicas that run and hold the current
    weights) hides the others from calls and weight syncs; by default every replica is admitted."""

    def __init__(self, urls: list[str]) -> None:
        self.replicas = [Replica(u) for u in urls]
        self.admits: Callable[[str], bool] = lambda _url: True

    def __iter__(self) -> Iterator[Replica]:
        return iter(self.replicas)

    def __len__(self) -> int:
        return len(self.replicas)

    def route(self, session_id: str | None) -> list[Replica]:
        """Replicas in the order to try: sticky (rendezvous hash) for sessions, least-loaded otherwise; the
        ones cooling down after a failure last, as a last resort."""
        if len(self.replicas) == 1:  # one replica (most runs): nothing to rank; this runs on every call
            only = self.replicas[0]
            return [only] if self.admits(only.url) else []
        now = time.monotonic()
        admitted = [r for r in self.replicas if self.admits(r.url)]
        if session_id is not None:
            ranked = sorted(admitted, key=lambda r: rendezvous_hash(session_id, r.url), reverse=True)
        else:
            ranked = sorted(admitted, key=lambda r: r.in_flight)
        return [r for r in ranked if r.healthy(now)] + [r for r in ranked if not r.healthy(now)]

    def admitted(self) -> list[Replica]:
        """The replicas a weight sync pushes to now (a restarting one gets the weights when it is back)."""
        return [r for r in self.replicas if self.admits(r.url)]

    def clear_cooldowns(self, url: str | None = None) -> None:
        """Route to ``url`` (every replica: None) again at once: it was restarted or is serving again."""
        for r in self.replicas:
            if url is None or r.url == url:
                r.down_until = 0.0

    def new_pools(self, auth: dict[str, str]) -> None:
        """Keep-alive pools for non-streamed calls, made on the current event loop."""
        for r in self.replicas:
            r.close_pool()
            r.pool = Http1Pool(r.url, auth)

    def close(self) -> None:
        for r in self.replicas:
            r.close_pool()


def probe_sync(client: httpx.Client, url: str, kind: str) -> str | None:
    """Why ``url`` cannot serve as a ``kind`` replica, or None when its ``GET /health`` answers 200."""
    try:
        resp = client.get(f"{url}/health")
    except httpx.ConnectError as exc:
        return f"refused the connection (nothing listens there: {exc})"
    except httpx.TimeoutException:
        return f"did not answer GET /health within {client.timeout.connect}s"
    except httpx.HTTPError as exc:
        return f"failed GET /health ({type(exc).__name__}: {exc})"
    if resp.status_code != 200:
        return f"answered GET /health with HTTP {resp.status_code}: not a {kind} server, or not ready"
    return None


class HealthProbe:
    """Each replica's ``GET /health``, probed concurrently with ``health_timeout_s`` each, the answer reused
    for ``health_ttl_s``; concurrent callers share one probe. So ``/health`` on the gateway costs the replicas
    at most one probe per TTL and never waits longer than one timeout."""

    def __init__(self, replicas: ReplicaSet, config: UpstreamConfig) -> None:
        self.replicas = replicas
        self.config = config
        self._answer: tuple[float, dict[str, Any]] | None = None  # (monotonic time, answer) of the last probe
        self._probe: asyncio.Future[dict[str, Any]] | None = None

    async def health(self, client: httpx.AsyncClient) -> dict[str, Any]:
        cached = self._answer
        if cached is not None and time.monotonic() - cached[0] < self.config.health_ttl_s:
            return cached[1]
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._probe_all(client))
        return await asyncio.shield(self._probe)

    async def _probe_all(self, client: httpx.AsyncClient) -> dict[str, Any]:
        states = await asyncio.gather(*(self._probe_one(client, r) for r in self.replicas.replicas))
        up = sum(s["state"] == "ok" for s in states)
        state = "ok" if up == len(states) else "degraded" if up else "unavailable"
        kind = self.config.kind
        answer: dict[str, Any] = {"state": state, "kind": kind, "replicas": states}
        if not up:
            answer["error"] = f"no {kind} replica answered GET /health"
        self._answer = (time.monotonic(), answer)
        return answer

    async def _probe_one(self, client: httpx.AsyncClient, replica: Replica) -> dict[str, Any]:
        timeout_s = self.config.health_timeout_s
        out: dict[str, Any] = {"url": replica.url, "in_flight": replica.in_flight}
        try:
            resp = await client.get(f"{replica.url}/health", timeout=httpx.Timeout(timeout_s))
        except httpx.TimeoutException:
            return {**out, "state": "down", "error": f"no answer to GET /health within {timeout_s}s"}
        except httpx.HTTPError as exc:
            return {**out, "state": "down", "error": f"{type(exc).__name__}: {exc}"}
        if resp.status_code != 200:
            return {**out, "state": "down", "error": f"GET /health answered HTTP {resp.status_code}"}
        cooling_s = replica.down_until - time.monotonic()
        if cooling_s > 0:  # answers its probe, but a request failed on it moments ago
            out["cooldown_s"] = round(cooling_s, 3)
        return {**out, "state": "ok"}
