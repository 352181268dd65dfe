"""Connecting to a Ray cluster, and refusing up front what it cannot place.

``distribution.coordinator_address`` picks the cluster:

- ``None``: start a private local cluster sized to fit the run (the embedded default);
- ``"auto"``: join the cluster that ``ray start`` left running on this machine;
- ``"ray://host:port"``: Ray Client to a remote head; ``"host:port"``: a GCS address.

Every path is bounded by ``connect_timeout_s`` and fails with a ``DistributedError`` that names
the address. Before any actor is placed, :func:`check_placeable` compares the per-role requests with
what the alive nodes have, so an impossible request is an error at start, not a silent hang.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from polar.errors import DistributedError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoleRequest:
    """``count`` actors of one role (``rollout``, ``learner``, ``gateway``, ...), each needing these resources."""

    role: str
    count: int
    num_cpus: float
    num_gpus: float = 0.0
    config_key: str = ""  # where the user set it, for error messages
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per actor

    @classmethod
    def of(cls, role: str, count: int, res, config_key: str) -> RoleRequest:
        """From a ``RoleResources`` config section."""
        return cls(role, count, res.num_cpus, res.num_gpus, config_key, dict(res.resources))

    @property
    def total_cpus(self) -> float:
        return self.count * self.num_cpus

    @property
    def total_gpus(self) -> float:
        return self.count * self.num_gpus


@dataclass
class ClusterHandle:
    """A connection made by :func:`connect`; ``shutdown`` only tears down what we started."""

    address: str | None
    started_local: bool
    nodes: list[dict[str, Any]] = field(default_factory=list)

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()


def _ray():
    try:
        import ray
    except ImportError:
        raise DistributedError(
            "distribution.backend is 'ray' but Ray is not installed. Install it with "
            "`pip install 'polar-rl[ray]'` (ray>=2.40) or set distribution.backend: local."
        ) from None
    return ray


def _host_port(address: str) -> tuple[str, int] | None:
    rest = address.split("://", 1)[1] if "://" in address else address
    if ":" not in rest:
        return None
    host, _, port = rest.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None


def _probe_tcp(address: str, timeout_s: float) -> None:
    """Fail fast (bounded) when nothing listens at the address, before Ray's own long retries."""
    hp = _host_port(address)
    if hp is None:
        raise DistributedError(
            f"distribution.coordinator_address {address!r} is not 'auto', 'ray://host:port' or 'host:port'. "
            "Fix the address (the Ray head prints it after `ray start --head`)."
        )
    try:
        with socket.create_connection(hp, timeout=timeout_s):
            pass
    except OSError as e:
        raise DistributedError(
            f"cannot reach the Ray cluster at distribution.coordinator_address={address!r} "
            f"within {timeout_s:g} s ({e.__class__.__name__}: {e}). Check that the head node is running "
            "(`ray status` on it), that the port is open from here, or set coordinator_address: null "
            "to start a local cluster."
        ) from None


def _init_with_deadline(ray, timeout_s: float, label: str, **kwargs) -> None:
    """``ray.init`` in a helper thread, so a cluster that accepts TCP but never answers still fails in time."""
    outcome: dict[str, BaseException | None] = {}

    def target() -> None:
        try:
            ray.init(**kwargs)
            outcome["error"] = None
        except BaseException as e:
            outcome["error"] = e

    th = threading.Thread(target=target, name="polar-ray-init", daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        raise DistributedError(
            f"the Ray cluster at distribution.coordinator_address={label!r} did not answer within "
            f"{timeout_s:g} s (distribution.connect_timeout_s). Check the head node, or raise the timeout."
        )
    err = outcome.get("error")
    if err is not None:
        raise DistributedError(
            f"could not connect to the Ray cluster at distribution.coordinator_address={label!r}: "
            f"{err.__class__.__name__}: {err}"
        ) from None


def connect(
    coordinator_address: str | None,
    connect_timeout_s: float = 30.0,
    requests: list[RoleRequest] | None = None,
    runtime_env: dict[str, Any] | None = None,
    require_total: bool = True,
) -> ClusterHandle:
    """Join (or start) the cluster named by ``coordinator_address`` and check ``requests`` fit it."""
    ray = _ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    requests = requests or []
    if coordinator_address not in (None, "auto"):
        _probe_tcp(coordinator_address, connect_timeout_s)
    if ray.is_initialized():
        # an embedding program (or a test) already connected; use it as is
        handle = ClusterHandle(address=coordinator_address, started_local=False)
    elif coordinator_address is None:
        need = sum(r.total_cpus for r in requests)
        num_cpus = max(os.cpu_count() or 1, math.ceil(need))
        if need > (os.cpu_count() or 1):
            logger.info(
                "local Ray cluster: %g CPUs requested on a %d-core machine; declaring %d logical CPUs",
                need, os.cpu_count() or 1, num_cpus,
            )
        # starting a cluster is local work with its own timeouts; ray.init must run on the main thread here
        # Ray nices its workers to 15 by default; rollout actors are the throughput path (the local
        # backend's worker processes run at normal priority too), so a cluster we start does not
        os.environ.setdefault("RAY_worker_niceness", "0")
        try:
            # address="local": always a new private cluster, even when another one runs on this machine
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING,
                     log_to_driver=True, runtime_env=runtime_env)
        except Exception as e:
            raise DistributedError(f"could not start a local Ray cluster (coordinator_address: null): {e}") from None
        handle = ClusterHandle(address=None, started_local=True)
    elif coordinator_address == "auto":
        _init_with_deadline(
            ray, connect_timeout_s, "auto", address="auto", logging_level=logging.WARNING, runtime_env=runtime_env
        )
        handle = ClusterHandle(address="auto", started_local=False)
    else:
        _init_with_deadline(
            ray, connect_timeout_s, coordinator_address,
            address=coordinator_address, logging_level=logging.WARNING, runtime_env=runtime_env,
        )
        handle = ClusterHandle(address=coordinator_address, started_local=False)
    handle.nodes = alive_nodes()
    try:
        check_placeable(requests, handle.nodes, require_total=require_total)
    except DistributedError:
        if handle.started_local:
            handle.shutdown()
        raise
    return handle


def alive_nodes() -> list[dict[str, Any]]:
    """``[{node_id, address, resources}]`` for every alive node (total, not free, resources)."""
    ray = _ray()
    return [
        {"node_id": n["NodeID"], "address": n.get("NodeManagerAddress", "?"), "resources": dict(n.get("Resources", {}))}
        for n in ray.nodes()
        if n.get("Alive")
    ]


_BUILTIN = ("CPU", "GPU", "memory", "object_store_memory")


def _describe(nodes: list[dict[str, Any]]) -> str:
    def custom(res: dict[str, float]) -> str:
        return "".join(
            f" {k}={v:g}" for k, v in sorted(res.items())
            if k not in _BUILTIN and not k.startswith(("node:", "accelerator_type"))
        )

    return ", ".join(
        f"{n['address']}: CPU={n['resources'].get('CPU', 0):g} GPU={n['resources'].get('GPU', 0):g}{custom(n['resources'])}"
        for n in nodes
    ) or "no alive nodes"


def ray_options(res) -> dict[str, Any]:
    """``actor.options(...)`` keywords for a ``RoleResources`` section."""
    opts: dict[str, Any] = {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus}
    if res.resources:
        opts["resources"] = dict(res.resources)
    return opts


def check_placeable(requests: list[RoleRequest], nodes: list[dict[str, Any]], require_total: bool = True) -> None:
    """Raise if any one actor fits on no node, or (``require_total``) if all of them together exceed the cluster."""
    for r in requests:
        if r.count <= 0:
            continue
        fits = [
            n for n in nodes
            if n["resources"].get("CPU", 0) >= r.num_cpus and n["resources"].get("GPU", 0) >= r.num_gpus
            and all(n["resources"].get(k, 0) >= v for k, v in r.resources.items())
        ]
        if not fits:
            custom = "".join(f", {k}={v:g}" for k, v in r.resources.items())
            raise DistributedError(
                f"{r.config_key or r.role}: each {r.role} actor asks for num_cpus={r.num_cpus:g}, "
                f"num_gpus={r.num_gpus:g}{custom}, but no node of the cluster has that much ({_describe(nodes)}). "
                f"Lower {r.config_key or 'the request'} or add a node that has it."
            )
    if not require_total:
        return
    total_cpu = sum(n["resources"].get("CPU", 0) for n in nodes)
    total_gpu = sum(n["resources"].get("GPU", 0) for n in nodes)
    need_cpu = sum(r.total_cpus for r in requests)
    need_gpu = sum(r.total_gpus for r in requests)
    if need_cpu > total_cpu + 1e-9 or need_gpu > total_gpu + 1e-9:
        parts = ", ".join(f"{r.role} {r.count}x(cpu={r.num_cpus:g}, gpu={r.num_gpus:g})" for r in requests if r.count)
        raise DistributedError(
            f"the run asks for CPU={need_cpu:g} GPU={need_gpu:g} in all ({parts}), but the cluster has "
            f"CPU={total_cpu:g} GPU={total_gpu:g} ({_describe(nodes)}). Lower distribution.rollout_workers "
            "or the per-role num_cpus/num_gpus, or add nodes."
        )


def wait_ready(refs: list[Any], timeout_s: float, what: str, min_ready: int | None = None) -> list[Any]:
    """Wait for actors' ``ready()`` refs (all, or ``min_ready`` of them); return the ready ones.

    Names what is still pending when the deadline passes.
    """
    ray = _ray()
    want = len(refs) if min_ready is None else max(1, min(min_ready, len(refs)))
    ready, pending = ray.wait(list(refs), num_returns=want, timeout=timeout_s)
    if len(ready) < want:
        raise DistributedError(
            f"{len(pending)} of {len(refs)} {what} did not start within {timeout_s:g} s. The cluster has "
            f"{ray.available_resources()} free; they may be waiting for resources no node has free, "
            "or their node died. Check `ray status`."
        )
    try:
        ray.get(ready)
    except ray.exceptions.RayActorError as e:  # the constructor raised (bad config, missing module, ...)
        raise DistributedError(f"{what} failed to start: {e}") from None
    return ready
