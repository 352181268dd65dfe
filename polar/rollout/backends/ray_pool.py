"""Driver-side pool of rollout actors: first-ready fragments, replacement of dead actors, elastic size.

Each live worker keeps ``inflight_per_worker`` (2) ``sample`` calls queued, so it never waits on the driver. ``next_fragment`` returns whichever finishes
first. When a call fails because its actor (or its node) died, the fragment it was building is
dropped and counted (``dropped_fragments``, ``dropped_episodes``: the episodes in progress on its env
copies), a replacement actor is started, and collection goes on with the others meanwhile.
``set_num_workers`` grows or shrinks the pool while running; a removed worker finishes its current
fragment first, so shrinking loses nothing.

Weights go to a worker once per version, with the first call it gets after ``publish``: inline in the
call when the numpy state is at most ``INLINE_WEIGHTS_BYTES`` (Ray inlines arguments up to that size
itself; a ``ray.put`` costs the driver and the raylet more than the bytes), packed into one buffer
(``polar.rollout.backends.ray_actor.pack_arrays``), else as one ``ray.put`` reference shared by every
worker. Fragments come back packed the same way and are unpacked here. ``PoolStats.weight_shipments``
counts the calls that carried weights.
Rollout actors record no Ray task events (``enable_task_events=False``): their calls are not in
``ray list tasks`` or ``ray timeline``, which would otherwise hold a few hundred calls a second.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from polar.distributed.cluster import wait_ready
from polar.errors import DistributedError, PolarError
from polar.rollout.backends.ray_actor import (
    LayoutCodec,
    RolloutWorker,
    pack_arrays,
    state_to_numpy,
    unpack_fragment,
)
from polar.types import Fragment

logger = logging.getLogger(__name__)

#: Weights up to this many bytes travel inline in the call (Ray's own ``max_direct_call_object_size``).
INLINE_WEIGHTS_BYTES = 100 * 1024


@dataclass
class PoolStats:
    restarts: int = 0
    dropped_fragments: int = 0
    dropped_episodes: int = 0
    weight_shipments: int = 0  # sample calls that carried weights (once per worker per version)
    fragments: int = 0
    env_steps: int = 0
    started_at: float = field(default_factory=time.monotonic)
    per_worker_steps: dict[int, int] = field(default_factory=dict)


@dataclass
class _Slot:
    actor: Any
    ready_ref: Any | None  # set until the actor has answered ready()
    retiring: bool = False
    started_at: float = field(default_factory=time.monotonic)
    sent_version: int | None = None  # the newest weights version sent to this actor (calls run in order)


class RayRolloutPool:
    """``num_workers`` rollout actors with ``envs_per_worker`` envs each; see the module docstring."""

    def __init__(
        self,
        cfg_data: dict[str, Any],
        config_dir: str | None,
        num_workers: int,
        envs_per_worker: int,
        num_steps: int,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        seed: int = 0,
        start_timeout_s: float = 120.0,
        auto_relaunch: bool = True,
        inflight_per_worker: int = 2,
        resources: dict[str, float] | None = None,
        min_ready: int | None = None,
    ) -> None:
        import ray

        if num_workers < 1:
            raise DistributedError("distribution.rollout_workers must be >= 1 with the ray backend")
        self._ray = ray
        self.cfg_data = cfg_data
        self.config_dir = config_dir
        self.envs_per_worker = envs_per_worker
        self.num_steps = num_steps
        self.seed = seed
        self.start_timeout_s = start_timeout_s
        self.auto_relaunch = auto_relaunch
        self.inflight_per_worker = max(1, inflight_per_worker)  # 2: the next fragment starts while this one ships
        # no task events: a few hundred sample calls a second would each be recorded by the driver, the actor
        # and the GCS for Ray's task list and timeline; failures still surface as the calls' errors
        opts: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_restarts": 0, "enable_task_events": False}
        if resources:
            opts["resources"] = dict(resources)
        self.actor_resources = {"CPU": num_cpus, "GPU": num_gpus, **(resources or {})}
        self._cls = ray.remote(RolloutWorker).options(**opts)
        self._ids = itertools.count()
        self.slots: dict[int, _Slot] = {}
        self.inflight: dict[Any, int] = {}  # ObjectRef -> worker id
        self.version = -1
        self.weights: Any = None  # the newest weights: packed bytes (``pack_arrays``), or the ObjectRef of a numpy dict
        self.weights_layout: bytes | None = None  # the packed weights' layout (``LayoutCodec``); None with a ref
        self.codec = LayoutCodec()
        self.stats = PoolStats()
        self.target_workers = num_workers
        for _ in range(num_workers):
            self._spawn()
        # first start: every actor (or ``min_ready`` of them, after a learner restart on a cluster that
        # lost a node) must come up, or the run fails now with a clear message; the rest join when placed
        refs = {s.ready_ref: w for w, s in self.slots.items()}
        ready = wait_ready(list(refs), start_timeout_s, "rollout actors", min_ready=min_ready)
        for ref in ready:
            self.slots[refs[ref]].ready_ref = None
        self._window_steps = 0
        self._window_start = time.monotonic()

    # --- membership -----------------------------------------------------------------------------
    def _spawn(self) -> int:
        wid = next(self._ids)
        seed = self.seed + 1000 * (wid + 1)
        actor = self._cls.remote(self.cfg_data, self.config_dir, wid, self.envs_per_worker, seed)
        self.slots[wid] = _Slot(actor=actor, ready_ref=actor.ready.remote())
        return wid

    @property
    def num_workers(self) -> int:
        return sum(1 for s in self.slots.values() if not s.retiring)

    @property
    def pending_workers(self) -> int:
        """Workers started but not yet answering (constructor running, or waiting for resources)."""
        return sum(1 for s in self.slots.values() if s.ready_ref is not None and not s.retiring)

    def room_for_one(self) -> bool:
        """Whether the cluster has free resources for one more rollout actor right now."""
        free = self._ray.available_resources()
        return all(free.get(k, 0.0) + 1e-9 >= v for k, v in self.actor_resources.items() if v > 0)

    def set_num_workers(self, n: int) -> None:
        """Grow now; shrink by retiring the newest workers once their current fragment is in."""
        if n < 1:
            raise DistributedError(f"rollout workers must be >= 1 (asked for {n})")
        self.target_workers = n
        live = sorted(w for w, s in self.slots.items() if not s.retiring)
        for _ in range(n - len(live)):
            self._spawn()
        for wid in live[n:][::-1] if n < len(live) else []:
            self.slots[wid].retiring = True
            if self._busy(wid) == 0:
                self._remove(wid)
        logger.info("rollout workers: %d (target %d)", self.num_workers, n)

    def _busy(self, wid: int) -> int:
        return sum(1 for w in self.inflight.values() if w == wid)

    def _remove(self, wid: int) -> None:
        slot = self.slots.pop(wid, None)
        if slot is not None:
            self._ray.kill(slot.actor, no_restart=True)

    def _replace(self, wid: int, err: BaseException) -> None:
        slot = self.slots.pop(wid, None)
        for ref in [r for r, w in self.inflight.items() if w == wid]:
            self.inflight.pop(ref)  # queued behind the lost one: never started, nothing to count
        if slot is None:
            return
        self.stats.restarts += 1
        self.stats.dropped_fragments += 1
        self.stats.dropped_episodes += self.envs_per_worker
        logger.warning(
            "rollout worker %d died (%s); dropped its in-flight fragment (%d episodes in progress); starting a replacement",
            wid, type(err).__name__, self.envs_per_worker,
        )
        try:
            self._ray.kill(slot.actor, no_restart=True)
        except Exception:  # already gone with its node
            pass
        if not slot.retiring:
            self._spawn()

    # --- weights --------------------------------------------------------------------------------
    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Newest weights, sent to each worker with its next call: a copy inline, or one shared object-store copy."""
        arrays = state_to_numpy(state_dict)
        if sum(a.nbytes for a in arrays.values()) <= INLINE_WEIGHTS_BYTES:
            layout, self.weights = pack_arrays({(k, None): a for k, a in arrays.items()})  # a copy: updates are in place
            self.weights_layout = self.codec.encode(layout)
        else:
            self.weights, self.weights_layout = self._ray.put(arrays), None
        self.version = version

    # --- fragments ------------------------------------------------------------------------------
    def _launch(self, wid: int) -> None:
        slot = self.slots[wid]
        weights, layout = None, None
        if slot.sent_version != self.version and self.weights is not None:
            weights, layout, slot.sent_version = self.weights, self.weights_layout, self.version
            self.stats.weight_shipments += 1
        ref = slot.actor.sample.remote(self.num_steps, self.version, weights, layout)
        self.inflight[ref] = wid

    def _promote_started(self) -> None:
        """Replacement/added actors join once their constructor finished (non-blocking check)."""
        pending = {s.ready_ref: w for w, s in self.slots.items() if s.ready_ref is not None}
        if not pending:
            return
        done, _ = self._ray.wait(list(pending), num_returns=len(pending), timeout=0)
        for ref in done:
            wid = pending[ref]
            try:
                self._ray.get(ref)
            except self._ray.exceptions.RayActorError as e:
                self._replace(wid, e)
                continue
            except self._ray.exceptions.RayTaskError as e:
                raise _unwrap(e) from None
            self.slots[wid].ready_ref = None
        for wid, s in self.slots.items():
            if s.ready_ref is not None and time.monotonic() - s.started_at > self.start_timeout_s:
                logger.warning("rollout worker %d not started after %.0f s (waiting for resources?)", wid,
                               time.monotonic() - s.started_at)
                s.started_at = time.monotonic()

    def fill(self, per_worker: int | None = None) -> None:
        """Keep ``inflight_per_worker`` ``sample`` calls queued on every started, non-retiring worker."""
        self._promote_started()
        want = per_worker or self.inflight_per_worker
        for wid, s in list(self.slots.items()):
            if s.ready_ref is None and not s.retiring:
                for _ in range(want - self._busy(wid)):
                    self._launch(wid)

    def queue_depth(self) -> int:
        """Fragments finished by workers and not yet taken by the learner."""
        if not self.inflight:
            return 0
        done, _ = self._ray.wait(list(self.inflight), num_returns=len(self.inflight), timeout=0, fetch_local=False)
        return len(done)

    def next_fragment(self, timeout_s: float = 300.0, relaunch: bool | None = None) -> Fragment:
        """The first fragment any worker finishes; failures are replaced and counted, never returned."""
        relaunch = self.auto_relaunch if relaunch is None else relaunch
        deadline = time.monotonic() + timeout_s
        while True:
            if relaunch or not self.inflight:
                self.fill(per_worker=None if relaunch else 1)
            if not self.inflight:
                if time.monotonic() > deadline:
                    raise DistributedError(
                        f"no rollout worker became available within {timeout_s:g} s; "
                        f"cluster free resources: {self._ray.available_resources()}"
                    )
                time.sleep(0.05)
                continue
            done, _ = self._ray.wait(list(self.inflight), num_returns=1, timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            if not done:
                if time.monotonic() > deadline:
                    raise DistributedError(f"no fragment from {len(self.inflight)} rollout workers within {timeout_s:g} s")
                continue
            ref = done[0]
            wid = self.inflight.pop(ref)
            try:
                frag = unpack_fragment(self._ray.get(ref), self.codec)
            except self._ray.exceptions.RayActorError as e:
                self._replace(wid, e)
                continue
            except self._ray.exceptions.RayTaskError as e:
                raise _unwrap(e) from None
            slot = self.slots.get(wid)
            if slot is not None and slot.retiring:
                if self._busy(wid) == 0:
                    self._remove(wid)
            elif relaunch and slot is not None:
                self._launch(wid)
            self.stats.fragments += 1
            self.stats.env_steps += frag.env_steps
            self._window_steps += frag.env_steps
            self.stats.per_worker_steps[wid] = self.stats.per_worker_steps.get(wid, 0) + frag.env_steps
            return frag

    def collect_round(self, timeout_s: float = 300.0) -> list[Fragment]:
        """Synchronous mode: one fresh fragment per live worker, all with the current weights."""
        for ref in list(self.inflight):  # nothing stale may leak into a synchronous batch
            self.inflight.pop(ref)
        want = self.num_workers
        self.fill(per_worker=1)
        out: list[Fragment] = []
        while len(out) < want:
            frag = self.next_fragment(timeout_s, relaunch=False)
            if frag.policy_version != self.version:
                continue
            out.append(frag)
            if len(out) < want and not self.inflight:
                self.fill(per_worker=1)  # a replacement joined; ask it too
        return out

    def metrics(self) -> dict[str, float]:
        """Counters since start; ``rollout/env_steps_per_s`` over the window since the last call."""
        now = time.monotonic()
        rate = self._window_steps / max(now - self._window_start, 1e-9)
        self._window_steps, self._window_start = 0, now
        return {
            "rollout/workers": float(self.num_workers),
            "rollout/pending_workers": float(self.pending_workers),
            "rollout/env_steps_per_s": rate,
            "rollout/env_steps": float(self.stats.env_steps),
            "rollout/queue_depth": float(self.queue_depth()),
            "rollout/restarts": float(self.stats.restarts),
            "rollout/weight_shipments": float(self.stats.weight_shipments),
            "rollout/dropped_fragments": float(self.stats.dropped_fragments),
            "rollout/dropped_episodes": float(self.stats.dropped_episodes),
        }

    def actors(self) -> dict[int, Any]:
        return {w: s.actor for w, s in self.slots.items()}

    def close(self) -> None:
        for wid in list(self.slots):
            self._remove(wid)
        self.inflight.clear()


def _unwrap(err: BaseException) -> BaseException:
    """An error raised inside a worker (a bad env, a bad agent): surface polar's own error as is."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, PolarError):
        return cause
    return DistributedError(f"a rollout worker failed: {err}")
