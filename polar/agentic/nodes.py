"""Gateway nodes: where sessions' model calls go. Nodes register and heartbeat; new sessions go to the
least-loaded healthy node. An in-process gateway is a *static* node (always healthy, records read
directly); remote nodes are read over HTTP (``GET /sessions/{id}``)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from polar.errors import GatewayError
from polar.types import CallRecord

log = logging.getLogger(__name__)


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

    def load(self) -> float:
        reported = float(self.reported.get("active_sessions", 0) or 0)
        busy = max(self.active, reported)
        return busy / self.capacity if self.capacity else float(busy)

    def describe(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id, "url": self.url, "capacity": self.capacity, "active": self.active,
            "static": self.static, "draining": self.draining, "reported": self.reported,
            "seconds_since_heartbeat": round(time.monotonic() - self.last_heartbeat, 3),
        }


class NodeRegistry:
    """Thread-compatible (used from one event loop). ``heartbeat_timeout_s`` marks silent nodes unhealthy."""

    def __init__(self, heartbeat_timeout_s: float = 30.0) -> None:
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.nodes: dict[str, GatewayNode] = {}
        self._http: httpx.AsyncClient | None = None

    def register(self, node_id: str, url: str, *, capacity: int = 0, static: bool = False, server: Any = None,
                 admin_token: str | None = None) -> GatewayNode:
        if not url.startswith(("http://", "https://")):
            raise GatewayError(f"gateway node {node_id!r}: url must start with http:// or https:// (got {url!r})")
        old = self.nodes.get(node_id)
        node = GatewayNode(node_id, url.rstrip("/"), capacity, static, server, admin_token)
        if old is not None:
            node.active = old.active
        self.nodes[node_id] = node
        log.info("gateway node %s registered at %s", node_id, node.url)
        return node

    def heartbeat(self, node_id: str, report: dict[str, Any] | None = None) -> GatewayNode:
        node = self.nodes.get(node_id)
        if node is None:
            raise KeyError(node_id)
        node.last_heartbeat = time.monotonic()
        node.reported = dict(report or {})
        return node

    def remove(self, node_id: str) -> None:
        self.nodes.pop(node_id, None)

    def healthy(self, node: GatewayNode) -> bool:
        if node.draining:
            return False
        return node.static or time.monotonic() - node.last_heartbeat <= self.heartbeat_timeout_s

    def pick(self) -> GatewayNode:
        """The least-loaded healthy node with room; ties go to the one that registered first."""
        candidates = [n for n in self.nodes.values() if self.healthy(n) and (not n.capacity or n.active < n.capacity)]
        if not candidates:
            if not self.nodes:
                raise GatewayError("no gateway node is registered; start a gateway and register it")
            raise GatewayError(f"no healthy gateway node with free capacity among {sorted(self.nodes)}")
        node = min(candidates, key=lambda n: n.load())
        node.active += 1
        return node

    def release(self, node: GatewayNode) -> None:
        node.active = max(0, node.active - 1)

    async def records(self, node: GatewayNode, session_id: str, timeout_s: float = 30.0) -> list[CallRecord]:
        """The session's call records on ``node`` (empty when it made none)."""
        if node.server is not None:
            return list(node.server.records(session_id))
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=timeout_s)
        headers = {"authorization": f"Bearer {session_id}"}
        if node.admin_token:
            headers["x-polar-admin-token"] = node.admin_token
        resp = await self._http.get(f"{node.url}/sessions/{session_id}", headers=headers)
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
                         stop: asyncio.Event | None = None, capacity: int = 0) -> None:
    """Run on a gateway node: register with a rollout service, then heartbeat ``report()`` until ``stop``."""
    stop = stop or asyncio.Event()
    async with httpx.AsyncClient(timeout=10.0) as http:
        await http.post(f"{service_url}/nodes/register", json={"node_id": node_id, "url": node_url, "capacity": capacity})
        while not stop.is_set():
            try:
                await http.post(f"{service_url}/nodes/{node_id}/heartbeat", json=report())
            except httpx.HTTPError as e:
                log.warning("heartbeat to %s failed: %s", service_url, e)
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
            except asyncio.TimeoutError:
                pass
