"""``distribution.backend: ray``: the rollout backend with workers as Ray actors on a cluster.

Same contract as the local backend (``polar.rollout.backends.base``): first-ready fragments tagged
with policy versions, weights published without blocking (sent to each worker once per version, see
``polar.rollout.backends.ray_pool``). On
top of it, the Ray backend:

- joins the cluster named by ``distribution.coordinator_address`` (or starts a local one) and
  refuses at start what no node can place (``polar.distributed.cluster``);
- replaces a rollout actor that died, alone or with its node; the fragment it was building is
  dropped and counted in ``rollout/dropped_fragments`` and ``rollout/dropped_episodes``;
- resizes while running on ``polar scale RUN_DIR --rollout-workers N`` (``attach_run_dir``), or by
  the ``distribution.autoscale`` rule (``polar.rollout.backends.autoscale``); every resize is logged with
  its reason and appended to ``RUN_DIR/scale_events.jsonl``.

With ``polar run`` this backend lives inside the learner actor (``polar.trainers.ray_driver``),
so fragments travel rollout actor -> learner actor through the object store, never via the driver.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from polar.distributed.cluster import ClusterHandle, RoleRequest, connect
from polar.distributed.control import ScaleWatcher
from polar.errors import ConfigError
from polar.rollout.backends.autoscale import Autoscaler
from polar.types import Fragment

if TYPE_CHECKING:
    from polar.config.run import EnvRunConfig
    from polar.rollout.backends.ray_pool import RayRolloutPool

logger = logging.getLogger(__name__)


class RayBackend:
    """Rollout workers as Ray actors; see the module docstring."""

    def __init__(self, cfg: EnvRunConfig, fragment_steps: int, seed: int, config_dir: Path | None = None,
                 partial_start: bool = False,
                 rollout_workers: int | None = None, autoscale: bool = True, on_policy: bool = False) -> None:
        """``partial_start``: start once one rollout actor is up and place the rest as resources free up
        (a learner restarted after losing a node may find a smaller cluster than the run asked for).
        ``on_policy`` (PPO): one ``sample`` call per actor, launched only once every call in flight has
        returned, so each batch is collected with the weights published after the last update (else two
        calls per actor stay queued and PPO trains on fragments up to 2 updates old).
        ``rollout_workers`` / ``autoscale``: where a restarted learner takes over from its predecessor
        (the count it had scaled to; whether a ``polar scale`` request had turned the rule off)."""
        from polar.harness import make_vector_env

        dist = cfg.distribution
        if dist.rollout_workers < 1:
            raise ConfigError(
                "distribution.rollout_workers: the ray backend runs envs in rollout actors, so it needs at least 1 "
                "(got 0). Set rollout_workers >= 1, or use backend: local to step envs in the learner."
            )
        self.cfg = cfg
        self.dist = dist
        self.fragment_steps = fragment_steps
        self.seed = seed
        self.config_dir = config_dir if config_dir is not None else cfg.config_dir
        self.envs_per_worker = dist.envs_per_runner
        self.num_workers = rollout_workers or dist.rollout_workers
        self.num_envs = self.num_workers * self.envs_per_worker
        probe = make_vector_env(cfg.harness, 1, seed=seed, config_dir=self.config_dir)  # spaces, and bad ids fail here
        self.observation_space = probe.single_observation_space
        self.action_space = probe.single_action_space
        probe.close()
        self.cluster: ClusterHandle | None = None
        self.pool: RayRolloutPool | None = None
        self.version = 0
        self.partial_start = partial_start
        self.on_policy = on_policy
        self._watcher = ScaleWatcher(None)
        self._events_path: Path | None = None
        self.autoscaler = Autoscaler(dist.autoscale) if dist.autoscale is not None else None
        if self.autoscaler is not None:
            self.autoscaler.enabled = autoscale
        self.scale_events = 0
        self._blocked = False
        self._lag_sum = 0.0
        self._lag_n = 0
        self._lag_max = 0
        self._wait_s = 0.0
        self._window_start = time.monotonic()
        self._closed = False

    # --- lifecycle ------------------------------------------------------------------------------
    def role_requests(self) -> list[RoleRequest]:
        return [RoleRequest.of("rollout", self.num_workers, self.dist.rollout_resources, "distribution.rollout_resources")]

    def start(self, policy_state: dict[str, torch.Tensor], version: int = 0, policy: Any = None) -> None:
        """``policy`` is unused: each rollout actor builds its own from the config."""
        from polar.rollout.backends.ray_pool import RayRolloutPool

        self.cluster = connect(self.dist.coordinator_address, self.dist.connect_timeout_s, self.role_requests(),
                               require_total=not self.partial_start)
        r = self.dist.rollout_resources
        try:
            self.pool = RayRolloutPool(
                self.cfg.model_dump(mode="json"),
                str(self.config_dir) if self.config_dir else None,
                num_workers=self.num_workers,
                envs_per_worker=self.envs_per_worker,
                num_steps=self.fragment_steps,
                num_cpus=r.num_cpus,
                num_gpus=r.num_gpus,
                seed=self.seed,
                start_timeout_s=max(self.dist.connect_timeout_s, 120.0),
                resources=r.resources,
                min_ready=1 if self.partial_start else None,
                # on_policy: the pool refills (one call per actor) only when nothing is in flight
                auto_relaunch=not self.on_policy,
                inflight_per_worker=1 if self.on_policy else 2,
            )
        except BaseException:
            self._shutdown_cluster()
            raise
        self.publish_weights(policy_state, version)
        self.pool.fill()

    def _running(self) -> RayRolloutPool:
        """The pool, once ``start()`` made it."""
        if self.pool is None:
            raise RuntimeError("the ray rollout backend is not started; call start() first")
        return self.pool

    def attach_run_dir(self, run_dir: Path) -> None:
        """Watch ``RUN_DIR/control/scale.json`` (written by ``polar scale``) while running."""
        self._watcher = ScaleWatcher(Path(run_dir))
        self._events_path = Path(run_dir) / "scale_events.jsonl"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.pool is not None:
            self.pool.close()
        self._shutdown_cluster()

    def _shutdown_cluster(self) -> None:
        if self.cluster is not None and self.cluster.started_local:
            self.cluster.shutdown()

    # --- the contract ---------------------------------------------------------------------------
    def publish_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.version = version
        self._running().publish(state_dict, version)

    def next_fragment(self, timeout_s: float | None = None) -> Fragment:
        self._apply_scale_requests()
        pool = self._running()
        queued = pool.queue_depth() if self.autoscaler is not None and self.autoscaler.enabled else 0
        t0 = time.monotonic()
        frag = pool.next_fragment(timeout_s if timeout_s is not None else self.dist.worker_timeout_s)
        waited = time.monotonic() - t0
        lag = max(0, self.version - frag.policy_version)
        self._wait_s += waited
        self._lag_sum += lag
        self._lag_n += 1
        self._lag_max = max(self._lag_max, lag)
        if self.autoscaler is not None:
            self.autoscaler.observe(waited, queued, lag)
        return frag

    def set_num_workers(self, n: int) -> None:
        self._running().set_num_workers(n)
        self.num_workers = n
        self.num_envs = n * self.envs_per_worker

    def _apply_scale_requests(self) -> None:
        n = self._watcher.poll()
        if n is not None:
            if self.autoscaler is not None and self.autoscaler.enabled:
                self.autoscaler.enabled = False  # a person asked: their count wins for the rest of the run
                logger.info("autoscale: off for the rest of this run (`polar scale` asked for %d workers)", n)
            if n != self.num_workers:
                self._scale(n, "polar scale request", "request")
            self._watcher.applied(n)
        self._autoscale()

    def _autoscale(self) -> None:
        a = self.autoscaler
        if a is None or not a.enabled:
            return
        pool = self._running()
        if pool.pending_workers:
            a.reset()  # measure only while every worker is up, or a starting one reads as missing throughput
            return
        if not a.due():
            return
        room = self.num_workers < a.cfg.max_rollout_workers and pool.room_for_one()
        n, reason, sig = a.step(self.num_workers, room)
        if n != self.num_workers:
            self._scale(n, reason, "autoscale", signals={
                "wait_fraction": round(sig.wait_fraction, 4), "queue_per_worker": round(sig.queue_per_worker, 4),
                "policy_lag_mean": round(sig.policy_lag_mean, 4), "window_s": round(sig.window_s, 3)})
        else:
            blocked = not reason.startswith("hold")  # wanted more workers but could not add them
            if blocked and not self._blocked:
                logger.info("autoscale: stays at %d rollout workers (%s)", n, reason)
            else:
                logger.debug("autoscale: %d rollout workers (%s)", n, reason)
            self._blocked = blocked

    def _scale(self, n: int, reason: str, source: str, signals: dict[str, float] | None = None) -> None:
        """Resize, and say so: the log, ``scale_events.jsonl`` in the run dir, ``rollout/scale_events``."""
        old = self.num_workers
        logger.info("%s: %d -> %d rollout workers (%s)", source, old, n, reason)
        self.set_num_workers(n)
        self.scale_events += 1
        if self._events_path is not None:
            event = {"time": time.time(), "source": source, "from": old, "to": n, "reason": reason,
                     "policy_version": self.version, **({"signals": signals} if signals else {})}
            try:
                with open(self._events_path, "a") as f:
                    f.write(json.dumps(event) + "\n")
            except OSError as e:  # the decision stands; only its record is lost
                logger.warning("could not record the scale event in %s: %s", self._events_path, e)

    def metrics(self) -> dict[str, float]:
        """Per-role throughput, queue depth, policy lag, restarts, scaling (lag and wait: since the last call)."""
        out = self.pool.metrics() if self.pool is not None else {}
        now = time.monotonic()
        if self._lag_n:
            out["rollout/policy_lag_mean"] = self._lag_sum / self._lag_n
            out["rollout/policy_lag_max"] = float(self._lag_max)
        out["learner/wait_fraction"] = self._wait_s / max(now - self._window_start, 1e-9)
        self._lag_sum, self._lag_n, self._lag_max, self._wait_s, self._window_start = 0.0, 0, 0, 0.0, now
        out["rollout/scale_events"] = float(self.scale_events)
        out["rollout/target_workers"] = float(self.pool.target_workers) if self.pool is not None else 0.0
        if self.autoscaler is not None:
            out["autoscale/enabled"] = float(self.autoscaler.enabled)
            if self.autoscaler.last_signals is not None:
                sig = self.autoscaler.last_signals
                out["autoscale/wait_fraction"] = sig.wait_fraction
                out["autoscale/queue_per_worker"] = sig.queue_per_worker
        out["rollout/time_s"] = time.monotonic() - self.pool.stats.started_at if self.pool is not None else 0.0
        return out
