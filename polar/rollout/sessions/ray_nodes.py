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
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from polar.distributed.cluster import wait_ready

log = logging.getLogger(__name__)


class GatewayNodeActor:
    """One gateway node. ``engine_factory`` runs inside the actor (engines are built where they serve)."""

    def __init__(self, node_id: str, service_url: str, engine_factory: Callable[[], Any],
                 gateway_cfg: dict[str, Any] | None = None, capacity: int = 0, heartbeat_interval_s: float = 2.0,
                 loopback: bool = True, weights: tuple[Any, int] | None = None,
                 records_dir: str | None = None, service_token: str | None = None) -> None:
        import ray

        from polar.config.gateway import GatewayConfig
        from polar.gateway.server import GatewayServer
        from polar.rollout.sessions.nodes import heartbeat_loop

        self.node_id = node_id
        host = "127.0.0.1" if loopback else "0.0.0.0"
        # a random admin token per node, in memory only: harnesses reach neither /admin/* nor others' sessions
        token = (gateway_cfg or {}).get("admin_token") or secrets.token_urlsafe(32)
        cfg = GatewayConfig(**{**(gateway_cfg or {}), "host": host, "admin_token": token, "claimed_sessions_only": True})
        # records_dir: the run's gateway/sessions/, shared by every node (session keys never repeat)
        self.server = GatewayServer(cfg, engine_factory(), records_dir=records_dir).start()
        engine = self.server.engine
        if hasattr(engine, "configure_sync"):  # launched vLLM: each node writes its synced weights apart
            from pathlib import Path

            base = cfg.sync.dir or (str(Path(records_dir).parent / "weight_sync") if records_dir else None)
            if base is not None:
                engine.configure_sync(cfg.sync, Path(base) / node_id)
        if weights is not None:  # a replacement node: the run's current weights before it registers
            state, version = weights
            if isinstance(state, ray.ObjectRef):  # refs nested in an argument are not resolved by Ray
                state = ray.get(state)
            self.server.update_weights(state, int(version))
        ip = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
        self.url = f"http://{ip}:{self.server.port}"
        self._stop = asyncio.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(
                heartbeat_loop(service_url, node_id, self.url, self.report, heartbeat_interval_s, self._stop, capacity,
                               admin_token=token, service_token=service_token)
            )

        self._thread = threading.Thread(target=run, name=f"polar-heartbeat:{node_id}", daemon=True)
        self._thread.start()

    def report(self) -> dict[str, Any]:
        return {"node": self.node_id}

    def update_weights(self, state_dict: Any, version: int) -> dict[str, Any]:
        """Through this node's gateway drain (pause, in-flight calls, swap, resume, new version)."""
        return self.server.update_weights(state_dict, int(version))

    def policy_version(self) -> int:
        return int(self.server.engine.policy_version)

    def ready(self) -> dict[str, Any]:
        import ray

        return {"node_id": self.node_id, "url": self.url, "ray_node_id": ray.get_runtime_context().get_node_id(),
                "policy_version": int(self.server.engine.policy_version)}

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self.server.stop()


class RayGatewayNodes:
    """``num_nodes`` gateway actors spread over the cluster (``SPREAD``), each with ``gateway_resources``
    (``num_cpus``, ``num_gpus`` and the custom ``resources``)."""

    def __init__(self, num_nodes: int, service_url: str, engine_factory: Callable[[], Any],
                 num_cpus: float = 1.0, num_gpus: float = 0.0, gateway_cfg: dict[str, Any] | None = None,
                 capacity: int = 0, heartbeat_interval_s: float = 2.0, loopback: bool = True,
                 start_timeout_s: float = 120.0, resources: dict[str, float] | None = None,
                 records_dir: str | None = None, service_token: str | None = None) -> None:
        import ray

        self._ray = ray
        self._args = (service_url, engine_factory, gateway_cfg, capacity, heartbeat_interval_s, loopback)
        self._records_dir = records_dir
        # the run's rollout-service token, handed to each node actor in memory (its constructor's arguments)
        self._service_token = service_token
        opts: dict[str, Any] = dict(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, scheduling_strategy="SPREAD")
        if resources:
            opts["resources"] = dict(resources)
        self._cls = ray.remote(GatewayNodeActor).options(**opts)
        self._ids = itertools.count()
        self.actors: dict[str, Any] = {}
        self.restarts = 0
        self.weights: tuple[Any, int] | None = None  # (object ref of the state dict, version) of the last sync
        for _ in range(num_nodes):
            self._spawn()
        self.start_timeout_s = start_timeout_s
        self._starting: dict[str, tuple[Any, float]] = {}  # replacements not yet ready: (ready ref, spawn time)
        wait_ready([a.ready.remote() for a in self.actors.values()], start_timeout_s, "gateway node actors")

    def _spawn(self) -> str:
        node_id = f"ray-gateway-{next(self._ids)}"
        self.actors[node_id] = self._cls.remote(node_id, *self._args, weights=self.weights,
                                                records_dir=self._records_dir, service_token=self._service_token)
        return node_id

    def _still_starting(self, node_id: str) -> bool:
        """A replacement still building its engine (and taking the weights) within ``start_timeout_s``."""
        entry = self._starting.get(node_id)
        if entry is None:
            return False
        ref, since = entry
        done, _ = self._ray.wait([ref], timeout=0)
        if done:
            self._starting.pop(node_id)
            return False  # ready, or failed: the usual probe below tells which
        return time.monotonic() - since < self.start_timeout_s

    def update_weights(self, state_dict: Any, version: int, timeout_s: float = 900.0) -> list[str]:
        """Sync every node (each through its own drain); the state dict goes to the object store once.
        Replacements started later get these weights before they register. Returns the nodes that died
        during the sync (replaced by :meth:`check`); any other failure raises."""
        ref = self._ray.put(dict(state_dict))
        self.weights = (ref, int(version))
        calls = {node_id: actor.update_weights.remote(ref, int(version)) for node_id, actor in self.actors.items()}
        lost = []
        for node_id, call in calls.items():
            try:
                self._ray.get(call, timeout=timeout_s)
            except self._ray.exceptions.RayActorError:
                lost.append(node_id)  # its sessions move to the others; check() replaces it with these weights
        if len(lost) == len(calls):
            raise RuntimeError(f"every gateway node died during the weight sync to version {version}: {lost}")
        return lost

    def describe(self) -> list[dict[str, Any]]:
        return self._ray.get([a.ready.remote() for a in self.actors.values()], timeout=60)

    def check(self) -> list[str]:
        """Replace node actors that died (deregistering them first); returns the ids of the replacements."""
        new = []
        for node_id, actor in list(self.actors.items()):
            if self._still_starting(node_id):
                continue
            try:
                self._ray.get(actor.ready.remote(), timeout=30)
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.GetTimeoutError):
                log.warning("gateway node %s is gone; starting a replacement", node_id)
                self.actors.pop(node_id)
                self._deregister(node_id)
                with contextlib.suppress(Exception):  # a hung actor must not keep its resources
                    self._ray.kill(actor, no_restart=True)
                self.restarts += 1
                replacement = self._spawn()
                self._starting[replacement] = (self.actors[replacement].ready.remote(), time.monotonic())
                new.append(replacement)
        return new

    def _deregister(self, node_id: str) -> None:
        """Tell the rollout service the node is gone, so its sessions are re-dispatched without waiting
        for the heartbeat timeout. Best effort: the heartbeat timeout catches it anyway."""
        try:
            headers = {"authorization": f"Bearer {self._service_token}"} if self._service_token else {}
            httpx.delete(f"{self._args[0]}/nodes/{node_id}", timeout=10.0, headers=headers)
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


class RaySessionStack:
    """The rollout stack of an agent run with ``distribution.backend: ray``, with :class:`LocalStack`'s
    interface (``start``/``stop``, ``run_groups``, ``update_weights``, ``engine``), so the session Collector
    uses either: the rollout service runs here; ``num_nodes`` gateway nodes, each with its own engine built by
    ``engine_factory`` inside its actor, run as Ray actors with ``gateway_resources`` (``SPREAD`` over the
    cluster's nodes); new sessions go to the least-loaded node. A watchdog thread replaces dead node actors
    every ``check_interval_s`` (deregistering them, so their sessions move to a survivor at once), and a
    replacement gets the current weights before it registers. ``engine`` is a local engine of the same model
    that serves nothing: the learner is built from it.

    ``records_dir``: where every node writes its call records (the run's ``gateway/sessions/``; the nodes must
    see it, as the learner must see the run directory); ``results_dir``: the finished sessions
    (``RUN/sessions/``, :class:`~polar.rollout.sessions.store.SessionStore`). ``loopback``: the service and
    the nodes listen on 127.0.0.1 (every Ray node on this machine); ``None`` decides from the cluster's nodes,
    ``False`` listens on all interfaces and advertises the Ray node's IP."""

    def __init__(self, engine: Any, engine_factory: Callable[[], Any], runner: Any, verifier: Any, settings: Any,
                 num_nodes: int, num_cpus: float = 1.0, num_gpus: float = 0.0,
                 gateway_cfg: dict[str, Any] | None = None, heartbeat_timeout_s: float = 30.0,
                 check_interval_s: float = 5.0, start_timeout_s: float = 300.0,
                 resources: dict[str, float] | None = None, records_dir: str | Path | None = None,
                 results_dir: str | Path | None = None, loopback: bool | None = None) -> None:
        from polar.rollout.sessions.local import RolloutServer
        from polar.rollout.sessions.store import SessionStore

        self.engine = engine
        settings.model_name = engine.model_name
        self.loopback = _all_nodes_here() if loopback is None else loopback
        self.rollout = RolloutServer(runner, verifier, settings, heartbeat_timeout_s=heartbeat_timeout_s,
                                     host="127.0.0.1" if self.loopback else "0.0.0.0")
        self._node_args: dict[str, Any] = dict(num_nodes=num_nodes, engine_factory=engine_factory, num_cpus=num_cpus,
                               num_gpus=num_gpus, start_timeout_s=start_timeout_s, resources=resources,
                               heartbeat_interval_s=max(0.2, min(2.0, heartbeat_timeout_s / 4)),
                               loopback=self.loopback, records_dir=str(records_dir) if records_dir else None,
                               gateway_cfg={"accept_any_model": True, **(gateway_cfg or {})})
        self.session_store = (SessionStore(results_dir, records_dir, getattr(engine, "tokenizer", None))
                              if results_dir is not None else None)
        self.nodes: RayGatewayNodes | None = None
        self.check_interval_s = check_interval_s
        self._lock = threading.Lock()  # the watchdog's check() and a sync never touch the actors at once
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    def start(self) -> RaySessionStack:
        self.rollout.start()
        url = self.rollout.url
        if not self.loopback:  # the nodes on other machines reach the service at this Ray node's IP
            import ray

            url = f"http://{ray.util.get_node_ip_address()}:{self.rollout.port}"
        try:
            self.nodes = RayGatewayNodes(service_url=url, service_token=self.rollout.token, **self._node_args)
        except BaseException:
            self.rollout.stop()
            raise
        self._watchdog = threading.Thread(target=self._watch, name="polar-gateway-watchdog", daemon=True)
        self._watchdog.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(self.check_interval_s):
            try:
                with self._lock:
                    assert self.nodes is not None
                    replaced = self.nodes.check()
                if replaced:
                    log.warning("gateway node(s) replaced: %s", ", ".join(replaced))
            except Exception:
                log.exception("gateway node check failed")

    def run_groups(self, groups: list[tuple[dict[str, Any], int, dict[str, Any]]], timeout_s: float | None = None):
        out = self.rollout.run_groups(groups, timeout_s)
        if self.session_store is not None:
            self.session_store.append(r for g in out for r in g)
        return out

    def metrics(self) -> dict[str, float]:
        """``gateway/nodes`` (node actors now), ``gateway/restarts`` (replaced so far), and the rollout
        service's ``sessions/redispatched`` / ``sessions/node_lost`` counts since the start."""
        out: dict[str, float] = {}
        if self.nodes is not None:
            out.update({"gateway/nodes": float(len(self.nodes.actors)), "gateway/restarts": float(self.nodes.restarts)})
        pipeline = self.rollout.pipeline
        if pipeline is not None:
            load = pipeline.load()
            for key in ("sessions_redispatched", "sessions_node_lost"):
                if key in load:
                    out[key.replace("sessions_", "sessions/")] = float(load[key])
        return out

    def update_weights(self, state_dict: Any, version: int) -> dict[str, Any]:
        assert self.nodes is not None, "start() first"
        with self._lock:
            lost = self.nodes.update_weights(state_dict, version)
        self.engine.policy_version = int(version)
        return {"policy_version": int(version), "nodes": len(self.nodes.actors), "lost_during_sync": lost}

    def stop(self) -> None:
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join(30)
        if self.nodes is not None:
            self.nodes.close()
        self.rollout.stop()

    def __enter__(self) -> RaySessionStack:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _all_nodes_here() -> bool:
    """True when every alive Ray node runs on this machine (a local or ``cluster_utils`` cluster)."""
    import ray

    here = ray.util.get_node_ip_address()
    return all(n.get("NodeManagerAddress") == here for n in ray.nodes() if n.get("Alive"))


# distribution keys an agent run honours with each backend (the rest must stay at their defaults)
_AGENT_KEYS = {
    "local": {"backend", "num_gpus"},
    "ray": {"backend", "num_gpus", "rollout_workers", "gateway_resources", "coordinator_address", "connect_timeout_s"},
}


def agent_distribution_problems(distribution: Any, learner_actor: bool = False) -> list[str]:
    """The ``distribution`` keys set away from their defaults that an agent run cannot honour, each as a
    one-line reason naming ``distribution.<key>`` (empty: all honoured). With ``backend: ray``,
    ``rollout_workers`` is the number of gateway nodes (each with its engine; 0 means 1), and
    ``learner_resources`` counts only when the caller places the learner as an actor (``learner_actor``)."""
    defaults = type(distribution)()
    honoured = set(_AGENT_KEYS.get(distribution.backend, ()))
    if learner_actor and distribution.backend == "ray":
        honoured |= {"learner_resources", "max_learner_restarts", "num_learners", "learner_timeout_s"}
    problems = []
    for key in type(distribution).model_fields:
        if key in honoured or getattr(distribution, key) == getattr(defaults, key):
            continue
        why = ("agent runs with backend: local run one in-process gateway and engine" if distribution.backend == "local"
               else "agent runs on Ray place gateway nodes (rollout_workers, gateway_resources) and nothing else")
        problems.append(f"distribution.{key} is set ({getattr(distribution, key)!r}) but an agent run cannot honour "
                        f"it: {why}; remove it" + ("" if distribution.backend == "ray" else ", or set backend: ray"))
    return problems

