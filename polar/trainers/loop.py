"""The one training loop, for every kind of run: collect -> learn -> publish weights -> log -> checkpoint ->
evaluate. PPO, APPO, DQN, SAC, BC, IQL, CQL and PettingZoo runs run through ``TrainingLoop.train``, and it
serves GRPO's shape too (an SFT warm-up stage, ``total_steps`` as the budget)::

    for stage in warm_up:                                # fresh runs only (GRPO's SFT warm-up)
        until stage.budget: stage.learner.update(stage.collector.collect())
    evaluator.before(progress); collector.start(weights)
    while not budget(progress):                          # total_env_steps, gradient_steps, or GRPO's total_steps
        batch = collector.collect()                      # env fragments, replay, dataset minibatches, sessions
        count(batch)                                     # env steps, finished episodes
        stats = learner.update(batch)                    # the algorithm (polar.types.Learner)
        if not stats.get("update_skipped"):              # nothing changed: nothing to publish
            version += 1
            collector.publish(learner.weights(), version)
        once the iteration's env steps are in:           # PPO/APPO/GRPO: one batch; DQN/SAC: ~1000 steps
            log metrics, checkpoint, evaluator.periodic, stop_reward
    checkpoint; evaluator.final

The loop is concrete and final: a run is *composed* of a ``Collector``, a ``Learner`` and an ``Evaluator``
(``polar.types``) by ``polar.trainers.build.compose``, from the algorithm's row in ``polar.trainers.registry``.
Nothing here knows an algorithm. What is the loop's, and therefore the same for every run: the counters
(``iteration``, ``env_steps``, ``policy_version``), the metric names (``episode_reward_mean``, ``fps``,
``time_s``, ...), checkpoints every ``logging.checkpoint_freq`` iterations and at the end (the learner's and
the collector's ``state_dict`` at the top level, beside the counters), ``polar resume`` (rows logged after the
checkpoint are cut, TensorBoard purges from its step), Ctrl-C/SIGTERM at an iteration boundary, and the
progress callback (``on_iteration``) that drives the CLI bar and the Ray driver's relay.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, final

from polar.config.run import RunConfig
from polar.metrics.logger import EpisodeWindow, MetricsLogger
from polar.trainers.checkpoint import CheckpointManager, rng_state, set_rng_state
from polar.trainers.finite import check_losses
from polar.trainers.lifecycle import deferred_stop, stop_requested, stopped_after_checkpoint
from polar.trainers.observe import Observability, RunLogs
from polar.trainers.run_dir import RunDir
from polar.types import Batch, Collector, Evaluator, Learner, Metrics, Progress

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1

T = TypeVar("T")
OnIteration = Callable[[Metrics], None]
Budget = Callable[[Progress], bool]
"""True once the run's budget is spent (``total_env_steps``; offline: ``gradient_steps``; GRPO: ``total_steps``)."""

__all__ = ["CHECKPOINT_FORMAT", "Budget", "Closeable", "Metrics", "OnIteration", "Stage", "TrainingLoop",
           "close_learner", "env_steps_budget", "iterations_budget"]


class Closeable(Protocol):
    def close(self) -> None: ...


def close_learner(learner: object) -> None:
    """End what a learner holds beyond this process, if it has a ``close`` (a learner group's ranks)."""
    close = getattr(learner, "close", None)
    if callable(close):
        close()


def env_steps_budget(total_env_steps: int) -> Budget:
    """Done once ``total_env_steps`` env steps were counted (env runs)."""
    return lambda p: p.env_steps >= total_env_steps


def iterations_budget(iterations: int) -> Budget:
    """Done after ``iterations`` iterations (GRPO's ``total_steps``)."""
    return lambda p: p.iteration >= iterations


@dataclass(frozen=True)
class Stage(Generic[T]):
    """A stage before the main one (GRPO's SFT warm-up): its own collector and learner, run until ``budget`` (its
    ``Progress.iteration`` counts its updates) on a fresh run only. Its stats are logged as ``<name>/<key>``
    every ``log_every`` updates (x-axis: the stage's update count); when it changed weights it ends with one new
    policy version that the main collector starts with. The run's summary gets ``<name>: {updates, time_s,
    first, last}`` (``first``/``last``: the stats of its first and last update)."""

    name: str
    collector: Collector[T]
    learner: Learner[T]
    budget: Budget
    log_every: int = 10


@final
class TrainingLoop(Generic[T]):
    """The loop (module docstring), composed of a collector and a learner of the same batch type, an evaluator.

    - ``state``: the checkpoint to resume from (``None``: a fresh run); the collector and learner are already
      built for it (seeds), the loop restores their ``state_dict`` and its counters before the collector starts.
    - ``budget``: when the run is done; ``iteration_env_steps``: an iteration ends once this many env steps
      arrived since it began (0: after every batch); ``episode_window``: finished episodes
      ``episode_reward_mean`` averages over; ``stop_reward``: stop early once that mean reaches it.
    - ``on_iteration(metrics)`` is called after every iteration (progress bars, the Ray driver's relay);
      ``extra_metrics`` are constants logged every iteration (the Ray learner actor's restart count).
    - ``warm_up``: stages run before the main one on a fresh run; ``close_after``: what the final evaluation
      still uses (an agent run's rollout stack), closed after it, before the logger.
    - ``run_logs``: the run's log lines, opened by the compose function before it built the parts (their
      start-up lines belong to the run); the loop closes them when it ends (without: it opens its own).
    """

    def __init__(self, cfg: RunConfig, run_dir: RunDir, collector: Collector[T], learner: Learner[T],
                 evaluator: Evaluator, *, budget: Budget, state: Mapping[str, Any] | None = None,
                 iteration_env_steps: int = 0, episode_window: int = 100, stop_reward: float | None = None,
                 on_iteration: OnIteration | None = None, extra_metrics: Metrics | None = None,
                 warm_up: Sequence[Stage[Any]] = (), close_after: Sequence[Closeable] = (),
                 run_logs: RunLogs | None = None) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.collector = collector
        self.learner = learner
        self.evaluator = evaluator
        self.budget = budget
        self.state = state
        self.iteration_env_steps = iteration_env_steps
        self.stop_reward = stop_reward
        self.on_iteration = on_iteration
        self.extra_metrics = dict(extra_metrics or {})
        self.warm_up = tuple(warm_up)
        self.close_after = tuple(close_after)
        self.run_logs = run_logs
        self.env_steps = 0
        self.iteration = 0
        self.version = 0
        self.time_offset_s = 0.0
        self.window = EpisodeWindow(episode_window)
        self.summary: dict[str, Any] = {}
        self.checkpoints = CheckpointManager(run_dir.checkpoints_dir, keep=cfg.logging.keep_checkpoints)
        self._t0 = time.perf_counter()
        self._last_t, self._last_steps = 0.0, 0
        self._restored = False
        self._closed = False

    def close(self) -> None:
        """Release what a loop that is not trained holds: the collector, the learner's processes (a learner
        group), ``close_after`` (an agent run's stack) and the run's log lines (a handler on the ``polar``
        logger). ``train`` releases them itself; calling this again, or after ``train``, does nothing. ``with
        loop:`` calls it."""
        if self._closed:
            return
        self._closed = True
        try:
            try:
                self.collector.close()
            finally:
                close_learner(self.learner)
        finally:
            try:
                for thing in self.close_after:
                    thing.close()
            finally:
                if self.run_logs is not None:
                    self.run_logs.close()

    def __enter__(self) -> TrainingLoop[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def progress(self) -> Progress:
        return Progress(iteration=self.iteration, env_steps=self.env_steps, version=self.version)

    # ------------------------------------------------------------------ state
    def _state(self) -> dict[str, Any]:
        return {"format": CHECKPOINT_FORMAT, **self.learner.state_dict(), **self.collector.state_dict(),
                "env_steps": self.env_steps, "iteration": self.iteration, "policy_version": self.version,
                "time_s": self._elapsed(), "episodes": self.window.state_dict(), "rng": rng_state()}

    def _load_state(self, state: Mapping[str, Any]) -> None:
        self.learner.load_state_dict(state)
        self.env_steps = int(state.get("env_steps", 0))
        self.iteration = int(state.get("iteration", state.get("step", 0)))
        self.version = int(state["policy_version"])
        self.time_offset_s = float(state.get("time_s", 0.0))
        if "episodes" in state:
            self.window.load_state_dict(state["episodes"])
        self.collector.load_state_dict(state)  # after the counters: a collector may read them (replay: env_steps)
        if "rng" in state:
            set_rng_state(state["rng"])
        log.info("resumed from iteration %d (%d env steps)", self.iteration, self.env_steps)

    def restore(self) -> None:
        """Load ``state`` (the checkpoint to resume from) into the learner, the collector and the counters, once
        (``train`` does it first; tests and tools call it to inspect a resumed run without training)."""
        if self.state is not None and not self._restored:
            self._load_state(self.state)
        self._restored = True

    def _save_checkpoint(self) -> None:
        self.checkpoints.save(self.iteration, self._state())

    def _elapsed(self) -> float:
        return self.time_offset_s + (time.perf_counter() - self._t0)

    # ------------------------------------------------------------------ the run
    def train(self) -> dict[str, Any]:
        """The whole run; returns its summary (``env_steps``, ``iterations``, ``time_s``, episode means, what the
        warm-up stages and the evaluator add)."""
        from polar.config.loader import dump_config

        self._t0 = time.perf_counter()
        resume = self.state is not None
        if not resume:
            self.run_dir.write_config(dump_config(self.cfg))
        # a resumed run continues from its checkpoint's step: rows and TensorBoard events logged after it
        # (by a run that died before its next checkpoint) are cut, so no step appears twice
        step = None if self.state is None else int(self.state.get("env_steps", 0))
        if step is not None:
            self.run_dir.cut_metrics_after("env_steps", step)
        self.logger = MetricsLogger(self.run_dir.metrics_path,
                                    self.run_dir.tensorboard_dir if self.cfg.logging.tensorboard else None,
                                    purge_step=None if step is None else step + 1)
        # system/, time/, logs/, sinks
        self.observe = Observability(self.cfg.logging, self.run_dir, self.cfg.name, logs=self.run_logs)
        self.logger.sinks.extend(self.observe.sinks)
        stopped_early = False
        try:
            with deferred_stop():  # Ctrl-C / SIGTERM end the iteration first: the final checkpoint is consistent
                try:
                    if self.state is not None:
                        self.restore()
                    else:
                        for stage in self.warm_up:
                            self._run_stage(stage)
                    with self.observe.heartbeat.doing("evaluating the weights the run starts from"):
                        self.summary.update(self.evaluator.before(self.progress))
                    self.collector.start(self.learner.weights(), self.version)
                    self.run_dir.update_meta(status="running")
                    self._last_t, self._last_steps = self._elapsed(), self.env_steps
                    while not self.budget(self.progress) and not stop_requested():
                        if self._iterate():
                            stopped_early = True
                            break
                    self._save_checkpoint()
                finally:
                    try:
                        self.collector.close()
                    finally:
                        close_learner(self.learner)  # a learner group's ranks; the final evaluation acts without them
            if (signame := stop_requested()) is not None:
                raise stopped_after_checkpoint(signame, self.run_dir.path, self.checkpoints.latest(),
                                               f"iteration {self.iteration}")
            result: dict[str, Any] = {"env_steps": self.env_steps, "iterations": self.iteration,
                                      "time_s": self._elapsed(), "stopped_early": stopped_early,
                                      **self.window.summary(), **self.summary}
            with self.observe.heartbeat.doing("final evaluation"):
                result.update(self.evaluator.final(self.progress))
        finally:
            self._closed = True
            for thing in self.close_after:
                thing.close()
            self.logger.close()
            self.observe.close()
        self.run_dir.update_meta(status="finished", result={k: v for k, v in result.items() if k != "eval"})
        return result

    def _run_stage(self, stage: Stage[Any]) -> None:
        """A warm-up stage to its budget; one new policy version when it changed weights."""
        t0 = time.monotonic()
        updates, changed = 0, False
        first: Metrics = {}
        last: Metrics = {}
        stage.collector.start(stage.learner.weights(), self.version)
        try:
            while not stage.budget(Progress(iteration=updates, env_steps=0, version=self.version)):
                batch = stage.collector.collect()
                updates += 1
                with self.observe.heartbeat.doing(f"{stage.name} update {updates}: updating the policy"):
                    last = stage.learner.update(dataclasses.replace(batch, iteration=updates, version=self.version))
                first = first or last
                changed = changed or not last.get("update_skipped")
                if stage.log_every and updates % stage.log_every == 0:
                    self.logger.log({f"{stage.name}/updates": updates,
                                     **{f"{stage.name}/{k}": v for k, v in last.items()}}, updates)
        finally:
            try:
                stage.collector.close()
            finally:
                close_learner(stage.learner)  # a learner group's ranks: the next stage starts its own
        if changed:
            self.version += 1
        self.summary[stage.name] = {"updates": updates, "time_s": round(time.monotonic() - t0, 1),
                                    "first": first, "last": last}

    def _iterate(self) -> bool:
        """One iteration: collect -> update -> publish until its env steps are in, then report. True when
        ``stop_reward`` was reached."""
        target = self.env_steps + self.iteration_env_steps
        batches: list[Batch[T]] = []
        stats: Metrics = {}
        lags: list[float] = []
        update_s = 0.0
        timer, heartbeat = self.observe.timer, self.observe.heartbeat
        while True:
            with timer.stage("collect"), heartbeat.doing(f"iteration {self.iteration + 1}: collecting"):
                batch = self.collector.collect()
            t_update = time.perf_counter()
            self.env_steps += batch.env_steps
            self.window.add(batch.episode_returns, batch.episode_lengths, batch.episode_successes)
            lags.extend(self.version - v for v in batch.policy_versions)  # updates since the weights that acted
            stamped = dataclasses.replace(batch, run_env_steps=self.env_steps, iteration=self.iteration + 1,
                                          version=self.version)
            with timer.stage("learn"), heartbeat.doing(f"iteration {self.iteration + 1}: updating the policy"):
                stats.update(self.learner.update(stamped))
            if not stats.get("update_skipped"):
                self.version += 1
                with timer.stage("publish"), heartbeat.doing(f"iteration {self.iteration + 1}: sending weights "
                                                              f"v{self.version} to the rollouts"):
                    self.collector.publish(self.learner.weights(), self.version)
            update_s += time.perf_counter() - t_update
            batches.append(batch)
            if self.env_steps >= target or self.budget(self.progress):
                break
        return self._end_iteration(batches, stats, update_s, sum(lags) / len(lags) if lags else None)

    def _end_iteration(self, batches: list[Batch[T]], stats: Metrics, update_s: float,
                       policy_lag: float | None) -> bool:
        """Metrics, logs, checkpoint and eval after an iteration's updates; True when stop_reward was reached."""
        check_losses(stats, self.iteration + 1, self.env_steps)  # before its weights are checkpointed
        self.iteration += 1
        now = self._elapsed()
        metrics: Metrics = {"iteration": self.iteration, "env_steps": self.env_steps, "time_s": now,
                            "fps": (self.env_steps - self._last_steps) / max(1e-9, now - self._last_t),
                            "policy_version": self.version, **self.window.summary(), **stats}
        if policy_lag is not None:
            metrics["policy_lag"] = policy_lag
        metrics["learner/samples_per_s"] = sum(b.env_steps for b in batches) / max(1e-9, update_s)
        metrics.update(self.extra_metrics)
        metrics.update(self.collector.metrics())
        with self.observe.timer.stage("eval"), self.observe.heartbeat.doing(f"iteration {self.iteration}: evaluating"):
            metrics.update(self.evaluator.periodic(self.progress))
        metrics.update(self.observe.row())  # time/<stage>_s since the last row, the latest system/ sample
        self._last_t, self._last_steps = now, self.env_steps
        logging_cfg = self.cfg.logging
        if self.iteration % logging_cfg.log_interval == 0:
            self.logger.log(metrics, self.env_steps)
        if self.on_iteration is not None:
            self.on_iteration(metrics)
        if logging_cfg.checkpoint_freq and self.iteration % logging_cfg.checkpoint_freq == 0:
            with self.observe.heartbeat.doing(f"iteration {self.iteration}: saving a checkpoint"):
                self._save_checkpoint()
        goal, mean = self.stop_reward, metrics["episode_reward_mean"]
        if goal is not None and self.window.full and mean is not None and mean >= goal:
            log.info("stop_reward %.4g reached at %d env steps", goal, self.env_steps)
            return True
        return False
