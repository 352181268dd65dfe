"""Gateway nodes: where sessions' model calls go. Nodes register and heartbeat; new sessions go to the
least-loaded healthy node. An in-process gateway is a *static* node (always healthy, records read
directly); remote nodes are read over HTTP (``GET /sessions/{id}``).

A node is *lost* when it is deregistered, replaced by a node of the same id at another URL, silent for
longer than ``heartbeat_timeout_s``, or refuses connections when probed. The session pipeline re-dispatches
the sessions that were in flight on a lost node (see :mod:`polar.rollout.sessions.pipeline`)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from polar.errors import GatewayError
from polar.types import CallRecord, session_key

log = logging.getLogger(__name__)

# Requests one registry has in flight to its nodes at once (claims, record reads, probes); the rest wait
# here. httpx's pool scans its whole queue of waiting requests on every request it starts or ends, so 2,000
# sessions claiming at once through it took minutes (O(n^2)); an asyncio semaphore's queue costs O(1).
MAX_NODE_REQUESTS = 32


@dataclass
class GatewayNode:
    node_id: str
    url: str
    capacity: int = 0  # concurrent sessions; 0 = unbounded
    static: bool = False
    server: Any = None  # an in-process GatewayServer, when there is one
    admin_token: str | None = None
    active: int = 0  # sessions this registry placed here and that have not finished
    reported: dict[str, Any] = field(default_factory=dict)  # the node's own load report (heartbeat body)
    last_heartbeat: float = field(default_factory=time.monotonic)
    draining: bool = False
    down: str | None = None  # why this node is gone (deregistered, replaced, unreachable); None while up

    def load(self) -> float:
        reported = float(self.reported.get("active_sessions", 0) or 0)
        busy = max(self.active, reported)
        return busy / self.capacity if self.capacity else float(busy)

    def describe(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id, "url": self.url, "capacity": self.capacity, "active": self.active,
            "static": self.static, "draining": self.draining, "down": self.down, "reported": self.reported,
            "seconds_since_heartbeat": round(time.monotonic() - self.last_heartbeat, 3),
        }


class NodeRegistry:
    """Thread-compatible (used from one event loop). ``heartbeat_timeout_s`` marks silent nodes unhealthy."""

    def __init__(self, heartbeat_timeout_s: float = 30.0) -> None:
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.nodes: dict[str, GatewayNode] = {}
        self._http: httpx.AsyncClient | None = None
        self._slots = asyncio.Semaphore(MAX_NODE_REQUESTS)

    def _client(self, timeout_s: float) -> httpx.AsyncClient:
        if self._http is None:
            limits = httpx.Limits(max_connections=MAX_NODE_REQUESTS, max_keepalive_connections=MAX_NODE_REQUESTS)
            self._http = httpx.AsyncClient(timeout=timeout_s, limits=limits)
        return self._http

    def register(self, node_id: str, url: str, *, capacity: int = 0, static: bool = False, server: Any = None,
                 admin_token: str | None = None) -> GatewayNode:
        """Add a node. The same id at the same URL refreshes the entry; at a new URL the old one is lost."""
        if not url.startswith(("http://", "https://")):
            raise GatewayError(f"gateway node {node_id!r}: url must start with http:// or https:// (got {url!r})")
        url = url.rstrip("/")
        old = self.nodes.get(node_id)
        if old is not None and old.url == url:
            old.capacity, old.static, old.admin_token = capacity, static, admin_token
            old.server = server if server is not None else old.server
            old.last_heartbeat, old.down = time.monotonic(), None
            log.info("gateway node %s re-registered at %s", node_id, url)
            return old
        if old is not None:
            old.down = f"replaced by a node registered under the same id at {url}"
        node = GatewayNode(node_id, url, capacity, static, server, admin_token)
        self.nodes[node_id] = node
        log.info("gateway node %s registered at %s", node_id, node.url)
        return node

    def heartbeat(self, node_id: str, report: dict[str, Any] | None = None) -> GatewayNode:
        node = self.nodes.get(node_id)
        if node is None:
            raise KeyError(node_id)
        node.last_heartbeat = time.monotonic()
        node.reported = dict(report or {})
        node.down = None  # it answers again (a probe may have caught it restarting)
        return node

    def remove(self, node_id: str) -> None:
        node = self.nodes.pop(node_id, None)
        if node is not None:
            node.down = "deregistered"

    def mark_down(self, node: GatewayNode, reason: str) -> None:
        """Take ``node`` out of placement until it heartbeats again."""
        if node.down is None:
            log.warning("gateway node %s is down: %s", node.node_id, reason)
        node.down = reason

    def lost(self, node: GatewayNode) -> str | None:
        """Why sessions on ``node`` can no longer finish there, or None while it is up. Draining is not lost."""
        if node.down is not None:
            return node.down
        silent_s = time.monotonic() - node.last_heartbeat
        if not node.static and silent_s > self.heartbeat_timeout_s:
            return f"no heartbeat for {silent_s:.1f}s (heartbeat_timeout_s={self.heartbeat_timeout_s})"
        return None

    def healthy(self, node: GatewayNode) -> bool:
        return not node.draining and self.lost(node) is None

    def pick(self) -> GatewayNode:
        """The least-loaded healthy node with room; ties go to the one that registered first."""
        candidates = [n for n in self.nodes.values() if self.healthy(n) and (not n.capacity or n.active < n.capacity)]
        if not candidates:
            if not self.nodes:
                raise GatewayError("no gateway node is registered; start a gateway and register it")
            why = {n.node_id: ("draining" if n.draining else self.lost(n) or f"full ({n.active}/{n.capacity})")
                   for n in self.nodes.values()}
            raise GatewayError(f"no healthy gateway node with free capacity: {why}")
        node = min(candidates, key=lambda n: n.load())
        node.active += 1
        return node

    def release(self, node: GatewayNode) -> None:
        node.active = max(0, node.active - 1)

    async def probe(self, node: GatewayNode, timeout_s: float = 5.0) -> str | None:
        """Ask the node's ``/health``; returns why it is unreachable (and marks it down), or None.

        Only a refused or unanswered *connection* counts: a slow or erroring node is alive, and its
        sessions' failures are their own."""
        try:
            async with self._slots:
                await self._client(30.0).get(f"{node.url}/health", timeout=timeout_s)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            reason = f"unreachable at {node.url} ({type(e).__name__}: {e or 'no answer'})"
            self.mark_down(node, reason)
            return reason
        except httpx.HTTPError:
            return None
        return None

    async def claim(self, node: GatewayNode, session_id: str, api_key: str, timeout_s: float = 30.0) -> None:
        """Give ``session_id`` on ``node`` to ``api_key`` before its harness runs (``POST /admin/claim``), so
        no other caller can create the session first. Without an admin token for a remote node the first
        call claims it (the gateway's own rule)."""
        if node.server is not None:
            from polar.gateway.sessions import key_hash

            owner = node.server.app.store.claim(session_id, key_hash(api_key))
            if owner != key_hash(api_key):
                raise GatewayError(f"session {session_id!r} already belongs to another API key")
            return
        if not node.admin_token:
            return
        try:
            async with self._slots:
                resp = await self._client(timeout_s).post(
                    f"{node.url}/admin/claim", json={"session_id": session_id, "api_key": api_key},
                    headers={"x-polar-admin-token": node.admin_token}, timeout=timeout_s)
        except httpx.HTTPError as e:
            raise GatewayError(f"{type(e).__name__}: {e}") from None
        if resp.status_code != 200:
            raise GatewayError(f"gateway node {node.node_id} answered {resp.status_code}: {resp.text[:200]}")

    async def records(self, node: GatewayNode, session_id: str, api_key: str | None = None,
                      timeout_s: float = 30.0) -> list[CallRecord]:
        """The session's call records on ``node`` (empty when it made none), read with the node's admin
        token, else the session's own key."""
        if node.server is not None:
            return list(node.server.records(session_id))
        headers = {"authorization": f"Bearer {api_key or session_key(session_id)}"}
        if node.admin_token:
            headers["x-polar-admin-token"] = node.admin_token
        async with self._slots:
            resp = await self._client(timeout_s).get(f"{node.url}/sessions/{session_id}", headers=headers)
        if resp.status_code == 404:
            return []
        if resp.status_code != 200:
            raise GatewayError(f"gateway node {node.node_id} answered {resp.status_code} for session {session_id}: {resp.text[:200]}")
        return [CallRecord.from_dict(d) for d in resp.json().get("records", [])]

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def describe(self) -> list[dict[str, Any]]:
        return [dict(n.describe(), healthy=self.healthy(n)) for n in self.nodes.values()]


async def heartbeat_loop(service_url: str, node_id: str, node_url: str, report: Any, interval_s: float = 10.0,
                         stop: asyncio.Event | None = None, capacity: int = 0, admin_token: str | None = None,
                         service_token: str | None = None) -> None:
    """Run on a gateway node: register with a rollout service (with the node's admin token, with which the
    service reads and reserves sessions), then heartbeat ``report()`` until ``stop``. ``service_token`` is
    the run's rollout-service token (the service refuses a node that does not send it)."""
    stop = stop or asyncio.Event()
    headers = {"authorization": f"Bearer {service_token}"} if service_token else {}
    async with httpx.AsyncClient(timeout=10.0, headers=headers) as http:
        body: dict[str, Any] = {"node_id": node_id, "url": node_url, "capacity": capacity}
        if admin_token:
            body["admin_token"] = admin_token
        resp = await http.post(f"{service_url}/nodes/register", json=body)
        if resp.status_code != 200:
            log.error("the rollout service at %s refused to register node %s (%d): %s", service_url, node_id,
                      resp.status_code, resp.text[:200])
        while not stop.is_set():
            try:
                resp = await http.post(f"{service_url}/nodes/{node_id}/heartbeat", json=report())
                if resp.status_code != 200:
                    log.warning("heartbeat to %s refused (%d): %s", service_url, resp.status_code, resp.text[:200])
            except httpx.HTTPError as e:
                log.warning("heartbeat to %s failed: %s", service_url, e)
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
            except asyncio.TimeoutError:
                pass
