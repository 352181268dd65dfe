"""The template-method loop the agent trainer (``polar.trainers.agent``) still subclasses until it is composed
like the env runs (``polar.trainers.loop``); deleted with it. Nothing else may use it."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from polar.config.run import RunConfig
from polar.metrics.logger import EpisodeWindow, MetricsLogger
from polar.trainers.checkpoint import CheckpointManager, rng_state, set_rng_state
from polar.trainers.finite import check_losses
from polar.trainers.lifecycle import deferred_stop, stop_requested, stopped_after_checkpoint
from polar.trainers.observe import Observability
from polar.trainers.run_dir import RunDir
from polar.types import Batch

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1

Metrics = dict[str, Any]
OnIteration = Callable[[Metrics], None]


@runtime_checkable
class Collector(Protocol):
    """Where batches come from. ``collect`` blocks until the next batch is there and raises a ``PolarError``
    (never hangs) when its source fails; ``publish`` hands new weights to whatever acts (workers, engine)."""

    def start(self, weights: Mapping[str, Any], version: int) -> None: ...

    def collect(self) -> Batch: ...

    def publish(self, weights: Mapping[str, Any], version: int) -> None: ...

    def metrics(self) -> Metrics: ...

    def close(self) -> None: ...


@runtime_checkable
class Learner(Protocol):
    """What an algorithm does with a batch. ``update`` returns its stats (loss terms named ``*_loss`` are
    checked for NaN/inf); ``update_skipped: 1`` in them means no weight changed, so nothing is published."""

    def update(self, batch: Batch) -> Metrics: ...

    def weights(self) -> Mapping[str, Any]: ...

    def learner_state(self) -> dict[str, Any]: ...

    def load_learner_state(self, state: dict[str, Any]) -> None: ...


class TrainingLoop(ABC):
    """The loop; a subclass is one kind of run's Learner and builds its Collector in ``_build``.

    ``on_iteration(metrics)`` is called after every iteration (progress bars, the Ray driver's relay);
    ``extra_metrics`` are constants logged every iteration (the Ray learner actor's restart count).
    """

    #: an iteration ends once this many env steps arrived since it began (0: after every batch)
    iteration_env_steps: int = 0
    #: finished episodes ``episode_reward_mean`` averages over
    episode_window: int = 100

    collector: Collector

    def __init__(self, cfg: RunConfig, run_dir: RunDir, resume: bool = False, on_iteration: OnIteration | None = None,
                 extra_metrics: Metrics | None = None) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.resume = resume
        self.on_iteration = on_iteration
        self.extra_metrics = dict(extra_metrics or {})
        self.env_steps = 0
        self.iteration = 0
        self.version = 0
        self.time_offset_s = 0.0
        self.window = EpisodeWindow(self.episode_window)
        self._t0 = time.perf_counter()

    # ------------------------------------------------------------------ the Learner seam (per kind)
    @abstractmethod
    def _build(self, state: dict[str, Any] | None) -> None:
        """Make ``self.collector`` and the learner's objects; restore ``state`` (a checkpoint) when given
        (``_load_state``), before the collector starts."""

    @abstractmethod
    def update(self, batch: Batch) -> Metrics:
        """One update on ``batch``; returns its stats (``update_skipped: 1`` when no weight changed)."""

    @abstractmethod
    def weights(self) -> Mapping[str, Any]:
        """The weights the collector acts with after an update."""

    @abstractmethod
    def learner_state(self) -> dict[str, Any]:
        """The learner's share of a checkpoint (weights, optimizer, normalizers)."""

    @abstractmethod
    def load_learner_state(self, state: dict[str, Any]) -> None:
        """Restore what ``learner_state`` saved."""

    @abstractmethod
    def finished(self) -> bool:
        """True when the run's budget is spent (env runs: ``total_env_steps``; GRPO: ``total_steps``)."""

    def evaluate(self, tag: str = "final", episodes: int | None = None) -> dict[str, Any]:
        """Evaluate the current weights; written to ``eval/<tag>.json``."""
        return {}

    def final_eval(self) -> dict[str, Any]:
        """The evaluation that ends a run; joins its summary."""
        return {}

    def periodic_eval(self) -> Metrics:
        """The evaluation due after this iteration, if any; what it returns joins the metrics row."""
        return {}

    def stop_reward(self) -> float | None:
        """Stop early once the training window's ``episode_reward_mean`` reaches this (None: never)."""
        return None

    def row_metrics(self, batches: list[Batch], stats: Metrics) -> Metrics:
        """This kind's extra fields of an iteration's metrics row."""
        return {}

    # ------------------------------------------------------------------ setup and state
    def _setup(self) -> None:
        """Open the checkpoints (the newest one on resume), build the learner and collector, start collecting."""
        self.checkpoints = CheckpointManager(self.run_dir.checkpoints_dir, keep=self.cfg.logging.keep_checkpoints)
        ckpt, state = self.checkpoints.load_newest() if self.resume else (None, None)
        if ckpt is not None:
            log.info("resuming from checkpoint %s", ckpt)
        # a resumed run continues from its checkpoint's step: rows and TensorBoard events logged after it
        # (by a run that died before its next checkpoint) are cut, so no step appears twice
        step = None if state is None else int(state.get("env_steps", 0))
        if step is not None:
            self.run_dir.cut_metrics_after("env_steps", step)
        self.logger = MetricsLogger(self.run_dir.metrics_path,
                                    self.run_dir.tensorboard_dir if self.cfg.logging.tensorboard else None,
                                    purge_step=None if step is None else step + 1)
        self.observe = Observability(self.cfg.logging, self.run_dir, self.cfg.name)  # system/, time/, logs/, sinks
        self.logger.sinks.extend(self.observe.sinks)
        try:
            self._build(state)
        except BaseException:
            self.logger.close()
            self.observe.close()
            raise

    def _state(self) -> dict[str, Any]:
        return {"format": CHECKPOINT_FORMAT, **self.learner_state(), "env_steps": self.env_steps,
                "iteration": self.iteration, "policy_version": self.version, "time_s": self._elapsed(),
                "episodes": self.window.state_dict(), "rng": rng_state()}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.load_learner_state(state)
        self.env_steps = int(state.get("env_steps", 0))
        self.iteration = int(state["iteration"])
        self.version = int(state["policy_version"])
        self.time_offset_s = float(state.get("time_s", 0.0))
        if "episodes" in state:
            self.window.load_state_dict(state["episodes"])
        if "rng" in state:
            set_rng_state(state["rng"])
        log.info("resumed from iteration %d (%d env steps)", self.iteration, self.env_steps)

    def _save_checkpoint(self) -> None:
        self.checkpoints.save(self.iteration, self._state())

    def _elapsed(self) -> float:
        return self.time_offset_s + (time.perf_counter() - self._t0)

    def _close(self) -> None:
        self.collector.close()
        self.logger.close()
        self.observe.close()

    # ------------------------------------------------------------------ the loop
    def train(self) -> dict[str, Any]:
        """The whole run; returns its summary (``env_steps``, ``iterations``, ``time_s``, episode means, ``eval``)."""
        from polar.config.loader import dump_config

        self._t0 = time.perf_counter()
        if not self.resume:
            self.run_dir.write_config(dump_config(self.cfg))
        self._setup()
        self.run_dir.update_meta(status="running")
        self._last_t, self._last_steps = self._elapsed(), self.env_steps
        stopped_early = False
        with deferred_stop():  # Ctrl-C / SIGTERM end the iteration first: the final checkpoint is consistent
            try:
                while not self.finished() and not stop_requested():
                    if self._iterate():
                        stopped_early = True
                        break
                self._save_checkpoint()
            finally:
                self._close()
        if (signame := stop_requested()) is not None:
            raise stopped_after_checkpoint(signame, self.run_dir.path, self.checkpoints.latest(),
                                           f"iteration {self.iteration}")
        result: dict[str, Any] = {"env_steps": self.env_steps, "iterations": self.iteration, "time_s": self._elapsed(),
                                  "stopped_early": stopped_early, **self.window.summary()}
        result.update(self.final_eval())
        self.run_dir.update_meta(status="finished", result={k: v for k, v in result.items() if k != "eval"})
        return result

    def _iterate(self) -> bool:
        """One iteration: collect -> update -> publish until its env steps are in, then report. True when
        ``stop_reward`` was reached."""
        target = self.env_steps + self.iteration_env_steps
        batches: list[Batch] = []
        stats: Metrics = {}
        lags: list[float] = []
        update_s = 0.0
        timer = self.observe.timer
        while True:
            with timer.stage("collect"):
                batch = self.collector.collect()
            t_update = time.perf_counter()
            self._count(batch)
            lags.extend(self.version - v for v in batch.policy_versions)  # updates since the weights that acted
            with timer.stage("learn"):
                stats.update(self.update(batch))
            if not stats.get("update_skipped"):
                self.version += 1
                with timer.stage("publish"):
                    self.collector.publish(self.weights(), self.version)
            update_s += time.perf_counter() - t_update
            batches.append(batch)
            if self.env_steps >= target or self.finished():
                break
        return self._end_iteration(batches, stats, update_s, sum(lags) / len(lags) if lags else None)

    def _count(self, batch: Batch) -> None:
        """Count a batch's env steps and finished episodes."""
        self.env_steps += batch.env_steps
        self.window.add(batch.episode_returns, batch.episode_lengths, batch.episode_successes)

    def _end_iteration(self, batches: list[Batch], stats: Metrics, update_s: float, policy_lag: float | None) -> bool:
        """Metrics, logs, checkpoint and eval after an iteration's updates; True when stop_reward was reached."""
        check_losses(stats, self.iteration + 1, self.env_steps)  # before its weights are checkpointed
        self.iteration += 1
        now = self._elapsed()
        metrics: Metrics = {"iteration": self.iteration, "env_steps": self.env_steps, "time_s": now,
                            "fps": (self.env_steps - self._last_steps) / max(1e-9, now - self._last_t),
                            **self.window.summary(), **stats}
        if policy_lag is not None:
            metrics["policy_lag"] = policy_lag
        metrics.update(self.row_metrics(batches, stats))
        metrics["learner/samples_per_s"] = sum(b.env_steps for b in batches) / max(1e-9, update_s)
        metrics.update(self.extra_metrics)
        metrics.update(self.collector.metrics())
        with self.observe.timer.stage("eval"):
            metrics.update(self.periodic_eval())
        metrics.update(self.observe.row())  # time/<stage>_s since the last row, the latest system/ sample
        self._last_t, self._last_steps = now, self.env_steps
        logging_cfg = self.cfg.logging
        if self.iteration % logging_cfg.log_interval == 0:
            self.logger.log(metrics, self.env_steps)
        if self.on_iteration is not None:
            self.on_iteration(metrics)
        if logging_cfg.checkpoint_freq and self.iteration % logging_cfg.checkpoint_freq == 0:
            self._save_checkpoint()
        goal, mean = self.stop_reward(), metrics["episode_reward_mean"]
        if goal is not None and self.window.full and mean is not None and mean >= goal:
            log.info("stop_reward %.4g reached at %d env steps", goal, self.env_steps)
            return True
        return False
