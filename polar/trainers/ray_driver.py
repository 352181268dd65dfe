"""The learner as a Ray actor, and the driver that starts, watches and restarts it.

With ``distribution.backend: ray``, ``polar run`` / ``polar resume`` do not learn in their own
process. ``RayLearnerDriver`` joins the cluster, checks that the learner and the rollout workers can
be placed, and starts one ``LearnerActor`` with ``distribution.learner_resources``. The actor runs the
one training loop, composed by the same ``polar.trainers.build.compose`` as a local run (same config and run
directory; only the rollout backend differs); its Ray backend creates
the rollout actors from inside the learner actor, so fragments go rollout actor -> learner actor
through the object store and never pass through the driver.

An agent run (GRPO/SFT) goes the same way: the actor runs the loop ``polar.trainers.agentic_run.build_agent_loop`` composes (the same
loop) on ``build_ray_stack``: the rollout service and a local copy of the model (the learner's) live in the
actor, and ``max(1, rollout_workers)`` gateway nodes, each with its own engine, are Ray actors the learner
owns, placed with ``distribution.gateway_resources``; every new version goes to every node, and a lost
node's sessions move to a survivor (``polar.rollout.sessions.ray_nodes``).

The driver only relays progress (``progress()``, polled every ``poll_interval_s``, feeds the CLI
progress bar / ``on_iteration``) and waits. If the learner actor dies (its process or its node), the
driver starts a new one that resumes from the last checkpoint in the run directory, up to
``distribution.max_learner_restarts`` times, counted as ``learner/restarts`` in the metrics. Its
rollout actors die with it (Ray fate-shares actors with their owner) and the new learner makes new
ones. ``run.json`` records where each learner ran (``learner``, ``learner_history``).

The learner writes checkpoints and metrics into the run directory itself, so on a multi-machine
cluster the run directory must be on a filesystem the learner's node shares with the driver, or the
learner must be pinned to the driver's machine (``learner_resources.resources``); an actor that
cannot see the run directory fails at start with that message.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from polar.distributed.cluster import RoleRequest, connect, ray_options, wait_ready
from polar.errors import DistributedError, PolarError

if TYPE_CHECKING:
    from polar.config.run import EnvRunConfig, RunConfig
    from polar.rollout.backends.base import RolloutBackend
    from polar.trainers.loop import OnIteration, TrainingLoop
    from polar.trainers.run_dir import RunDir
    from polar.types import Metrics

logger = logging.getLogger(__name__)

PROGRESS_ROWS = 10_000  # metrics rows the actor keeps for the driver to relay (one per iteration)


class Trainer(Protocol):
    def train(self) -> dict[str, Any]: ...


class Compose(Protocol):
    """``polar.trainers.build.compose``: the env run's loop, as a local run composes it. The driver is handed it
    (build sits above this module), and the actor receives it by reference."""

    def __call__(self, cfg: EnvRunConfig, run_dir: RunDir, *, resume: bool = False,
                 on_iteration: OnIteration | None = None, extra_metrics: Metrics | None = None,
                 backend_factory: Callable[..., Any] | None = None) -> TrainingLoop[Any]: ...


class LearnerActor:
    """Runs the training loop in a Ray actor; ``train`` blocks, ``progress`` answers meanwhile (threaded actor)."""

    def __init__(self, cfg_data: dict[str, Any], config_dir: str | None, run_dir: str, resume: bool,
                 compose: Compose, learner_restarts: int = 0, log_level: int = logging.INFO,
                 rollout_workers: int | None = None, autoscale: bool = True) -> None:
        import ray
        import torch

        from polar.config import validate
        from polar.config.run import RunConfig
        from polar.trainers.run_dir import META, RunDir

        torch.set_num_threads(1)
        _configure_logging(log_level)
        ctx = ray.get_runtime_context()
        self.info = {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
                     "actor_id": ctx.get_actor_id()}
        if not (Path(run_dir) / META).is_file():
            raise DistributedError(
                f"the learner actor on node {self.info['node_ip']} cannot see the run directory {run_dir}. The "
                "learner writes checkpoints and metrics there: put runs on a filesystem every node shares "
                "(NFS, ...), or pin the learner to the driver's machine with "
                "distribution.learner_resources.resources (a custom resource only that node has)."
            )
        cfg = validate(RunConfig, cfg_data, source="config (learner actor)")
        if config_dir:
            cfg._config_dir = Path(config_dir)
        self._lock = threading.Lock()
        self._rows: deque[tuple[int, dict[str, Any]]] = deque(maxlen=PROGRESS_ROWS)
        self._seq = 0

        def backend_factory(cfg: EnvRunConfig, fragment_steps: int, seed: int, config_dir: Path | None = None,
                            on_policy: bool = False) -> RolloutBackend:
            from polar.rollout.backends.ray_backend import RayBackend

            # after a crash the cluster may have lost a node: start with what fits, place the rest later
            return RayBackend(cfg, fragment_steps, seed, config_dir=config_dir, partial_start=learner_restarts > 0,
                              rollout_workers=rollout_workers, autoscale=autoscale, on_policy=on_policy)

        extra = {"learner/restarts": learner_restarts}
        self.trainer: Trainer
        if cfg.kind == "agent":  # GRPO/SFT: the same loop, its sessions on gateway nodes this actor places
            # an LLM learner uses the CPUs its actor reserved (env learners keep 1 thread: small networks)
            torch.set_num_threads(max(1, int(cfg.distribution.learner_resources.num_cpus)))
            from polar.trainers.agentic_run import build_agent_loop, build_ray_stack
            from polar.trainers.registry import agent_algorithm

            self.trainer = build_agent_loop(agent_algorithm(cfg), cfg, RunDir.open(run_dir), resume=resume,
                                            on_iteration=self._record, extra_metrics=extra,
                                            stack_builder=build_ray_stack)
            return
        self.trainer = compose(cfg, RunDir.open(run_dir), resume=resume, on_iteration=self._record,
                               backend_factory=backend_factory, extra_metrics=extra)

    def ready(self) -> dict[str, Any]:
        return dict(self.info)

    def _record(self, metrics: dict[str, Any]) -> None:
        with self._lock:
            self._seq += 1
            self._rows.append((self._seq, dict(metrics)))

    def progress(self, since: int) -> tuple[int, list[dict[str, Any]]]:
        """``(last_seq, rows)``: the metrics rows recorded after sequence number ``since``."""
        with self._lock:
            return self._seq, [m for seq, m in self._rows if seq > since]

    def train(self) -> dict[str, Any]:
        return self.trainer.train()

    def gateway_nodes(self) -> list[dict[str, Any]]:
        """An agent run's gateway node actors now: ``{node_id, url, ray_node_id}`` each (operators, tests)."""
        nodes = getattr(getattr(getattr(self.trainer, "collector", None), "stack", None), "nodes", None)
        return nodes.describe() if nodes is not None else []

    def rollout_actors(self) -> dict[int, Any]:
        """The rollout actors this learner owns right now (for operators and tests)."""
        backend = getattr(getattr(self.trainer, "collector", None), "backend", None)
        pool = getattr(backend, "pool", None)
        if pool is None:
            return {}
        for _ in range(10):  # the training thread may resize the pool while this thread reads it
            try:
                return dict(pool.actors())
            except RuntimeError:
                time.sleep(0.01)
        return dict(pool.actors())


def _configure_logging(level: int) -> None:
    """Ray forwards the actor's stderr to the driver; polar's INFO lines (scaling decisions) should reach it."""
    log = logging.getLogger("polar")
    log.setLevel(level)
    if not log.handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        log.addHandler(h)
        log.propagate = False


class _LearnerDied(Exception):
    pass


class RayLearnerDriver:
    """Starts the learner actor, relays its progress, restarts it from the last checkpoint if it dies."""

    def __init__(self, cfg: RunConfig, run_dir: RunDir, compose: Compose, resume: bool = False,
                 on_iteration: Callable[[dict[str, Any]], None] | None = None, poll_interval_s: float = 0.2) -> None:
        self.cfg = cfg
        self.compose = compose
        self.run_dir = run_dir
        self.resume = resume
        self.on_iteration = on_iteration
        self.poll_interval_s = poll_interval_s
        self.actor: Any = None  # the LearnerActor's Ray handle
        self.learner_info: dict[str, Any] | None = None
        self.learner_restarts = 0
        self._history: list[dict[str, Any]] = []
        self._last_row: dict[str, Any] = {}  # the newest metrics row: a restarted learner keeps its scale

    def role_requests(self) -> list[RoleRequest]:
        d = self.cfg.distribution
        if self.cfg.kind == "agent":  # the learner, and one gateway node (with its engine) per rollout worker
            return [
                RoleRequest.of("learner", 1, d.learner_resources, "distribution.learner_resources"),
                RoleRequest.of("gateway", max(1, d.rollout_workers), d.gateway_resources,
                               "distribution.gateway_resources"),
            ]
        return [
            RoleRequest.of("learner", 1, d.learner_resources, "distribution.learner_resources"),
            RoleRequest.of("rollout", d.rollout_workers, d.rollout_resources, "distribution.rollout_resources"),
        ]

    # ------------------------------------------------------------------ run
    def train(self) -> dict[str, Any]:
        from polar.config.loader import dump_config

        d = self.cfg.distribution
        if d.rollout_workers < 1 and self.cfg.kind != "agent":
            from polar.errors import ConfigError

            raise ConfigError(
                "distribution.rollout_workers: the ray backend runs envs in rollout actors, so it needs at least 1 "
                "(got 0). Set rollout_workers >= 1, or use backend: local to step envs in the learner."
            )
        if not self.resume:
            self.run_dir.write_config(dump_config(self.cfg))
        cluster = connect(d.coordinator_address, d.connect_timeout_s, self.role_requests())
        try:
            return self._supervise()
        finally:
            self._kill()
            if cluster.started_local:
                cluster.shutdown()

    def _supervise(self) -> dict[str, Any]:
        from polar.trainers.checkpoint import CheckpointManager

        d = self.cfg.distribution
        resume = self.resume
        while True:
            self._start(resume)
            try:
                result = self._wait()
            except _LearnerDied as e:
                self._kill()
                if self.learner_restarts >= d.max_learner_restarts:
                    raise DistributedError(
                        f"the learner actor died ({e}) and was already restarted {self.learner_restarts} times "
                        f"(distribution.max_learner_restarts={d.max_learner_restarts}); giving up. "
                        f"`polar resume {self.run_dir.path}` continues from the last checkpoint."
                    ) from None
                self.learner_restarts += 1
                resume = CheckpointManager(self.run_dir.checkpoints_dir).latest() is not None
                logger.warning(
                    "the learner actor died (%s); restart %d of %d, %s", e, self.learner_restarts,
                    d.max_learner_restarts, "from the last checkpoint" if resume else "from scratch (no checkpoint yet)",
                )
                continue
            self.run_dir.update_meta(learner_restarts=self.learner_restarts)
            result["learner_restarts"] = self.learner_restarts
            return result

    def _start(self, resume: bool) -> None:
        import ray

        d = self.cfg.distribution
        cls = ray.remote(LearnerActor).options(**ray_options(d.learner_resources), max_restarts=0, max_concurrency=4)
        workers = self._last_row.get("rollout/target_workers")
        self.actor = cls.remote(
            self.cfg.model_dump(mode="json"), str(self.cfg.config_dir), str(Path(self.run_dir.path).resolve()), resume,
            self.compose, self.learner_restarts, logging.getLogger("polar").getEffectiveLevel(),
            int(workers) if workers else None, self._last_row.get("autoscale/enabled", 1.0) != 0,
        )
        wait_ready([self.actor.ready.remote()], max(d.connect_timeout_s, 120.0), "learner actor")
        self.learner_info = ray.get(self.actor.ready.remote(), timeout=60)
        entry = {**self.learner_info, "driver_pid": os.getpid(), "restarts": self.learner_restarts,
                 "resumed": resume, "started_at": time.time()}
        self._history.append(entry)
        logger.info("learner actor on node %s (pid %d)%s", entry["node_ip"], entry["pid"],
                    f", restart {self.learner_restarts}" if self.learner_restarts else "")
        # the actor only writes run.json from inside train(), which has not been called yet: no race
        self.run_dir.update_meta(learner=entry, learner_history=self._history, learner_restarts=self.learner_restarts)

    def _wait(self) -> dict[str, Any]:
        import ray

        ref = self.actor.train.remote()
        since = 0
        while True:
            done, _ = ray.wait([ref], timeout=self.poll_interval_s)
            since = self._relay(since)
            if done:
                break
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as e:
            raise _LearnerDied(type(e).__name__) from None
        except ray.exceptions.RayTaskError as e:  # the trainer raised: polar's own errors surface as they are
            cause = getattr(e, "cause", None)
            if isinstance(cause, PolarError):
                raise cause from None
            raise DistributedError(f"the learner actor failed: {e}") from None

    def _relay(self, since: int) -> int:
        """Hand the learner's new metrics rows to ``on_iteration``; a dead actor is noticed by ``_wait``."""
        import ray

        try:
            last, rows = ray.get(self.actor.progress.remote(since), timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return since
        if rows:
            self._last_row = rows[-1]
        if self.on_iteration is not None:
            for row in rows:
                self.on_iteration(row)
        return last

    def _kill(self) -> None:
        import ray

        if self.actor is not None:
            try:
                ray.kill(self.actor, no_restart=True)  # its rollout actors go with it
            except Exception:  # already gone with its node
                pass
            self.actor = None

    # ------------------------------------------------------------------ introspection
    def rollout_actors(self) -> dict[int, Any]:
        """The current learner's rollout actors (worker id -> actor handle)."""
        import ray

        return ray.get(self.actor.rollout_actors.remote(), timeout=60)
