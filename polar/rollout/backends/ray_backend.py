"""``distribution.backend: ray``: the rollout backend with workers as Ray actors on a cluster.

Same contract as the local backend (``polar.rollout.backends.base``): first-ready fragments tagged
with policy versions, weights published without blocking (one object-store copy per version). On
top of it, the Ray backend:

- joins the cluster named by ``distribution.coordinator_address`` (or starts a local one) and
  refuses at start what no node can place (``polar.distributed.cluster``);
- replaces a rollout actor that died, alone or with its node; the fragment it was building is
  dropped and counted in ``rollout/dropped_fragments`` and ``rollout/dropped_episodes``;
- resizes while running on ``polar scale RUN_DIR --rollout-workers N`` (``attach_run_dir``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from polar.distributed.cluster import ClusterHandle, RoleRequest, connect
from polar.distributed.control import ScaleWatcher
from polar.errors import ConfigError
from polar.rollout.fragment import Fragment

logger = logging.getLogger(__name__)


class RayBackend:
    """Rollout workers as Ray actors; see the module docstring."""

    def __init__(self, cfg, fragment_steps: int, seed: int, config_dir=None) -> None:
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
        self.config_dir = config_dir if config_dir is not None else getattr(cfg, "config_dir", None)
        self.envs_per_worker = dist.envs_per_runner
        self.num_workers = dist.rollout_workers
        self.num_envs = self.num_workers * self.envs_per_worker
        probe = make_vector_env(cfg.harness, 1, seed=seed, config_dir=self.config_dir)  # spaces, and bad ids fail here
        self.observation_space = probe.single_observation_space
        self.action_space = probe.single_action_space
        probe.close()
        self.cluster: ClusterHandle | None = None
        self.pool = None
        self.version = 0
        self._watcher = ScaleWatcher(None)
        self._lag_sum = 0.0
        self._lag_n = 0
        self._lag_max = 0
        self._closed = False

    # --- lifecycle ------------------------------------------------------------------------------
    def role_requests(self) -> list[RoleRequest]:
        r = self.dist.rollout_resources
        return [RoleRequest("rollout", self.num_workers, r.num_cpus, r.num_gpus, "distribution.rollout_resources")]

    def start(self, policy_state: dict[str, torch.Tensor], version: int = 0, policy=None) -> None:
        from polar.distributed.rollout_pool import RayRolloutPool

        self.cluster = connect(self.dist.coordinator_address, self.dist.connect_timeout_s, self.role_requests())
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
            )
        except BaseException:
            self._shutdown_cluster()
            raise
        self.publish_weights(policy_state, version)
        self.pool.fill()

    def attach_run_dir(self, run_dir: Path) -> None:
        """Watch ``RUN_DIR/control/scale.json`` (written by ``polar scale``) while running."""
        self._watcher = ScaleWatcher(Path(run_dir))

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
        self.pool.publish(state_dict, version)

    def next_fragment(self, timeout_s: float | None = None) -> Fragment:
        self._apply_scale_requests()
        frag = self.pool.next_fragment(timeout_s if timeout_s is not None else self.dist.worker_timeout_s)
        lag = max(0, self.version - frag.policy_version)
        self._lag_sum += lag
        self._lag_n += 1
        self._lag_max = max(self._lag_max, lag)
        return frag

    def set_num_workers(self, n: int) -> None:
        self.pool.set_num_workers(n)
        self.num_workers = n
        self.num_envs = n * self.envs_per_worker

    def _apply_scale_requests(self) -> None:
        n = self._watcher.poll()
        if n is not None and n != self.num_workers:
            logger.info("scale request: %d -> %d rollout workers", self.num_workers, n)
            self.set_num_workers(n)
        if n is not None:
            self._watcher.applied(n)

    def metrics(self) -> dict[str, float]:
        """Per-role throughput, queue depth, policy lag and restarts since start (reset lag window)."""
        out = self.pool.metrics() if self.pool is not None else {}
        if self._lag_n:
            out["rollout/policy_lag_mean"] = self._lag_sum / self._lag_n
            out["rollout/policy_lag_max"] = float(self._lag_max)
        self._lag_sum, self._lag_n, self._lag_max = 0.0, 0, 0
        out["rollout/time_s"] = time.monotonic() - self.pool.stats.started_at if self.pool is not None else 0.0
        return out
