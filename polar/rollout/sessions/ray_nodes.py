"""Gateway nodes as Ray actors: a model-API gateway (and its engine) per actor, registered with a
rollout service and kept alive by heartbeats, so sessions spread over the nodes of a cluster.

Each actor starts a ``GatewayServer`` on its Ray node, registers ``{node_id, url}`` with the rollout
service (``POST /nodes/register``) and heartbeats its load report. The service's registry sends new
sessions to the least-loaded healthy node. A node that dies stops heartbeating (and refuses connections):
after the registry's ``heartbeat_timeout_s`` at the latest, the sessions in flight on it are stopped and
re-dispatched to the other nodes (see :mod:`polar.rollout.sessions.pipeline`). :class:`RayGatewayNodes` replaces
dead node actors and deregisters the dead ones, which re-dispatches their sessions at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

import httpx

from polar.distributed.cluster import wait_ready

log = logging.getLogger(__name__)


class GatewayNodeActor:
    """One gateway node. ``engine_factory`` runs inside the actor (engines are built where they serve)."""

    def __init__(self, node_id: str, service_url: str, engine_factory: Callable[[], Any],
                 gateway_cfg: dict[str, Any] | None = None, capacity: int = 0, heartbeat_interval_s: float = 2.0,
                 loopback: bool = True) -> None:
        import ray

        from polar.config.gateway import GatewayConfig
        from polar.gateway.server import GatewayServer
        from polar.rollout.sessions.nodes import heartbeat_loop

        self.node_id = node_id
        host = "127.0.0.1" if loopback else "0.0.0.0"
        cfg = GatewayConfig(**{**(gateway_cfg or {}), "host": host})
        self.server = GatewayServer(cfg, engine_factory()).start()
        ip = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
        self.url = f"http://{ip}:{self.server.port}"
        self._stop = asyncio.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(
                heartbeat_loop(service_url, node_id, self.url, self.report, heartbeat_interval_s, self._stop, capacity)
            )

        self._thread = threading.Thread(target=run, name=f"polar-heartbeat:{node_id}", daemon=True)
        self._thread.start()

    def report(self) -> dict[str, Any]:
        return {"node": self.node_id}

    def ready(self) -> dict[str, Any]:
        import ray

        return {"node_id": self.node_id, "url": self.url, "ray_node_id": ray.get_runtime_context().get_node_id()}

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self.server.stop()


class RayGatewayNodes:
    """``num_nodes`` gateway actors spread over the cluster (``SPREAD``), each with ``gateway_resources``."""

    def __init__(self, num_nodes: int, service_url: str, engine_factory: Callable[[], Any],
                 num_cpus: float = 1.0, num_gpus: float = 0.0, gateway_cfg: dict[str, Any] | None = None,
                 capacity: int = 0, heartbeat_interval_s: float = 2.0, loopback: bool = True,
                 start_timeout_s: float = 120.0) -> None:
        import ray

        self._ray = ray
        self._args = (service_url, engine_factory, gateway_cfg, capacity, heartbeat_interval_s, loopback)
        self._cls = ray.remote(GatewayNodeActor).options(
            num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, scheduling_strategy="SPREAD"
        )
        self._ids = itertools.count()
        self.actors: dict[str, Any] = {}
        self.restarts = 0
        for _ in range(num_nodes):
            self._spawn()
        wait_ready([a.ready.remote() for a in self.actors.values()], start_timeout_s, "gateway node actors")

    def _spawn(self) -> str:
        node_id = f"ray-gateway-{next(self._ids)}"
        self.actors[node_id] = self._cls.remote(node_id, *self._args)
        return node_id

    def describe(self) -> list[dict[str, Any]]:
        return self._ray.get([a.ready.remote() for a in self.actors.values()], timeout=60)

    def check(self) -> list[str]:
        """Replace node actors that died (deregistering them first); returns the ids of the replacements."""
        new = []
        for node_id, actor in list(self.actors.items()):
            try:
                self._ray.get(actor.ready.remote(), timeout=30)
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.GetTimeoutError):
                log.warning("gateway node %s is gone; starting a replacement", node_id)
                self.actors.pop(node_id)
                self._deregister(node_id)
                with contextlib.suppress(Exception):  # a hung actor must not keep its resources
                    self._ray.kill(actor, no_restart=True)
                self.restarts += 1
                new.append(self._spawn())
        return new

    def _deregister(self, node_id: str) -> None:
        """Tell the rollout service the node is gone, so its sessions are re-dispatched without waiting
        for the heartbeat timeout. Best effort: the heartbeat timeout catches it anyway."""
        try:
            httpx.delete(f"{self._args[0]}/nodes/{node_id}", timeout=10.0)
        except httpx.HTTPError as e:
            log.warning("could not deregister gateway node %s: %s", node_id, e)

    def kill(self, node_id: str) -> None:
        self._ray.kill(self.actors[node_id], no_restart=True)

    def close(self) -> None:
        for actor in self.actors.values():
            try:
                self._ray.get(actor.stop.remote(), timeout=15)
            except Exception:  # already dead
                pass
            self._ray.kill(actor, no_restart=True)
        self.actors.clear()
