"""The on-policy loop: collect fragments -> advantages -> PPO update -> publish weights -> log ->
checkpoint -> (eval). Resumable from its last checkpoint.

``OnPolicyTrainer`` runs the loop in the calling process. ``build_trainer`` is what ``polar run`` uses:
the same trainer for ``distribution.backend: local``; for ``ray`` a driver that runs this trainer
inside a learner actor placed with ``distribution.learner_resources`` and restarts it from the last
checkpoint if it dies (``polar.trainers.ray_driver``).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from polar.algorithms.appo import APPOLearner
from polar.algorithms.ppo import PPOLearner
from polar.buffers.rollout_buffer import RolloutBuffer
from polar.config.loader import dump_config
from polar.config.policy import OFF_POLICY, ON_POLICY
from polar.errors import ConfigError
from polar.metrics.logger import EpisodeWindow, MetricsLogger
from polar.models.normalization import RunningNorm
from polar.models.policy import build_policy
from polar.rollout.backends.base import make_backend
from polar.trainers.checkpoint import CheckpointManager, rng_state, set_rng_state
from polar.trainers.finite import FiniteGuard, check_losses, harness_name
from polar.trainers.lifecycle import deferred_stop, stop_requested, stopped_after_checkpoint
from polar.trainers.run_dir import RunDir

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1


def build_trainer(cfg, run_dir: RunDir, resume: bool = False,
                  on_iteration: Callable[[dict[str, Any]], None] | None = None):
    """The trainer ``polar run``/``polar resume`` use; both kinds have ``train() -> result``."""
    if cfg.distribution.backend == "ray":
        from polar.trainers.ray_driver import RayLearnerDriver

        return RayLearnerDriver(cfg, run_dir, resume=resume, on_iteration=on_iteration)
    return trainer_class(cfg)(cfg, run_dir, resume=resume, on_iteration=on_iteration)


def trainer_class(cfg) -> type[OnPolicyTrainer]:
    """``OffPolicyTrainer`` for DQN/SAC, else this module's ``OnPolicyTrainer`` (PPO/APPO)."""
    if cfg.policy.type in OFF_POLICY:
        from polar.trainers.off_policy import OffPolicyTrainer

        return OffPolicyTrainer
    return OnPolicyTrainer


class OnPolicyTrainer:
    """PPO and APPO on any env harness. ``on_iteration(metrics)`` is called after every update (progress bars).

    ``backend_factory`` (default ``make_backend``) and ``extra_metrics`` (constants logged every
    iteration) let the Ray learner actor run this same loop with its own backend options and counters.
    """

    ALGORITHMS: tuple[str, ...] = ON_POLICY

    def __init__(self, cfg, run_dir: RunDir, resume: bool = False,
                 on_iteration: Callable[[dict[str, Any]], None] | None = None,
                 backend_factory: Callable[..., Any] | None = None,
                 extra_metrics: dict[str, Any] | None = None) -> None:
        if cfg.policy.type not in self.ALGORITHMS:
            raise ConfigError(f"policy.type: {type(self).__name__} runs {' or '.join(map(repr, self.ALGORITHMS))}, "
                              f"got {cfg.policy.type!r}")
        self.cfg = cfg
        self.kw = cfg.policy.kwargs
        self.run_dir = run_dir
        self.resume = resume
        self.on_iteration = on_iteration
        self.backend_factory = backend_factory or make_backend
        self.extra_metrics = dict(extra_metrics or {})
        self.env_steps = 0
        self.iteration = 0
        self.version = 0
        self.time_offset_s = 0.0
        self.window = EpisodeWindow(100)
        self.finite = FiniteGuard(cfg.nonfinite, harness_name(cfg.harness))  # NaN/inf: fail or skip
        self.connector_process_restarts = 0
        self.connector_copies_restarted = 0

    # ------------------------------------------------------------------ setup
    def _setup(self) -> None:
        cfg = self.cfg
        if cfg.distribution.num_gpus > 0:
            if not torch.cuda.is_available():
                log.warning("distribution.num_gpus=%s but no GPU is available here; the learner runs on CPU.",
                            cfg.distribution.num_gpus)
            else:
                log.info("distribution.num_gpus=%s: the learner runs on CPU (its small networks are faster there).",
                         cfg.distribution.num_gpus)
        torch.set_num_threads(1)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.checkpoints = CheckpointManager(self.run_dir.checkpoints_dir, keep=cfg.logging.keep_checkpoints)
        ckpt, state = self.checkpoints.load_newest() if self.resume else (None, None)
        if ckpt is not None:
            log.info("resuming from checkpoint %s", ckpt)
        seed = cfg.seed if state is None else cfg.seed + 104_729 * (int(state["iteration"]) + 1)  # fresh env seeds on resume
        self.backend = self.backend_factory(cfg, self._fragment_steps(), seed, config_dir=cfg.config_dir)
        rollout = self._fragment_steps() * cfg.distribution.num_envs
        if cfg.policy.type == "ppo" and (getattr(self.kw, "batch_size", None) or 0) > rollout:
            log.warning("policy.kwargs.batch_size %d is larger than one rollout (%d env steps: %d per env x %d envs): "
                        "every minibatch is the whole rollout. Lower batch_size, or raise n_steps or the env count.",
                        self.kw.batch_size, rollout, self._fragment_steps(), cfg.distribution.num_envs)
        try:
            self.policy = build_policy(cfg, self.backend.observation_space, self.backend.action_space, cfg.config_dir)
            self.learner = self._make_learner()
            normalize_reward = getattr(self.kw, "normalize_reward", False)
            self.reward_norm = RunningNorm((), self.kw.clip_reward) if normalize_reward else None
            if state is not None:
                self._load_state(state)
            if hasattr(self.backend, "attach_run_dir"):  # ray: `polar scale RUN_DIR` resizes while running
                self.backend.attach_run_dir(self.run_dir.path)
            self.backend.start(self.policy.state_dict(), self.version, policy=self.policy)
        except BaseException:
            self.backend.close()
            raise
        # a resumed run continues from its checkpoint's step: rows and TensorBoard events logged after it
        # (by a run that died before its next checkpoint) are cut, so no step appears twice
        if state is not None:
            self.run_dir.cut_metrics_after("env_steps", self.env_steps)
        self.logger = MetricsLogger(self.run_dir.metrics_path, self.run_dir.tensorboard_dir if cfg.logging.tensorboard else None,
                                    purge_step=None if state is None else self.env_steps + 1)

    def _fragment_steps(self) -> int:
        """Steps per env in one fragment (PPO's default splits ``rollout_samples`` across the envs)."""
        if self.cfg.policy.type == "ppo":
            return self.kw.steps_per_env(self.cfg.distribution.num_envs)
        return self.kw.n_steps

    def _make_learner(self):
        if self.cfg.policy.type == "appo":
            return APPOLearner(self.policy.agent, self.kw)
        return PPOLearner(self.policy.agent, self.kw, self.cfg.total_env_steps)

    def _state(self) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "policy": self.policy.state_dict(),
            "learner": self.learner.state_dict(),
            "reward_norm": self.reward_norm.state_dict() if self.reward_norm is not None else None,
            "env_steps": self.env_steps,
            "iteration": self.iteration,
            "policy_version": self.version,
            "time_s": self._elapsed(),
            "episodes": self.window.state_dict(),
            "rng": rng_state(),
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.learner.load_state_dict(state["learner"])
        if self.reward_norm is not None and state.get("reward_norm") is not None:
            self.reward_norm.load_state_dict(state["reward_norm"])
        self.env_steps = int(state["env_steps"])
        self.iteration = int(state["iteration"])
        self.version = int(state["policy_version"])
        self.time_offset_s = float(state["time_s"])
        self.window.load_state_dict(state["episodes"])
        set_rng_state(state["rng"])
        log.info("resumed from iteration %d (%d env steps)", self.iteration, self.env_steps)

    def _elapsed(self) -> float:
        return self.time_offset_s + (time.perf_counter() - self._t0)

    # ------------------------------------------------------------------ loop
    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        self._t0 = time.perf_counter()
        if not self.resume:
            self.run_dir.write_config(dump_config(cfg))
        self._setup()
        self.run_dir.update_meta(status="running")
        self._last_t, self._last_steps = self._elapsed(), self.env_steps
        stopped_early = False
        with deferred_stop():  # Ctrl-C / SIGTERM end the iteration first: the final checkpoint is consistent
            try:
                while self.env_steps < cfg.total_env_steps and not stop_requested():
                    if self._iterate():
                        stopped_early = True
                        break
                self._save_checkpoint()
            finally:
                self.backend.close()
                self.logger.close()
        if (signame := stop_requested()) is not None:
            raise stopped_after_checkpoint(signame, self.run_dir.path, self.checkpoints.latest(), f"iteration {self.iteration}")
        result: dict[str, Any] = {"env_steps": self.env_steps, "iterations": self.iteration, "time_s": self._elapsed(),
                                  "stopped_early": stopped_early, **self.window.summary()}
        if cfg.eval.at_end:
            result["eval"] = self.evaluate(tag="final")
        self.run_dir.update_meta(status="finished", result={k: v for k, v in result.items() if k != "eval"})
        return result

    def _next_fragment(self):
        """The backend's next fragment with finite observations and rewards (``nonfinite: fail`` raises on
        the first other one, naming its source; ``skip`` drops it and counts it)."""
        while True:
            frag = self.backend.next_fragment()
            if self.finite.accept(frag):
                return frag
            self._dropped(frag)

    def _dropped(self, frag) -> None:
        """Hook for a fragment ``nonfinite: skip`` dropped (the off-policy trainer's n-step windows forget it)."""

    def _absorb(self, f) -> None:
        """Count a fragment's steps and episodes, and fold its normalizer moments in."""
        self.env_steps += f.env_steps
        self.window.add(f.episode_returns, f.episode_lengths, f.episode_successes)
        self.connector_process_restarts += f.connector_process_restarts
        self.connector_copies_restarted += f.connector_copies_restarted
        if self.policy.obs_norm is not None and f.obs_moments is not None:
            self.policy.obs_norm.update_from_moments(f.obs_moments)
        if self.reward_norm is not None and f.return_moments is not None:
            self.reward_norm.update(*f.return_moments)

    def _iterate(self) -> bool:
        """One learner iteration: collect, update, publish, report. True when stop_reward was reached."""
        # APPO learns from each fragment as it arrives (V-trace corrects the lag); PPO waits for a
        # batch of one fragment per worker (read each time: the Ray backend resizes while running)
        n_frags = 1 if self.cfg.policy.type == "appo" else max(1, self.backend.num_workers)
        frags = [self._next_fragment() for _ in range(n_frags)]
        t_update = time.perf_counter()
        for f in frags:
            self._absorb(f)
        scale, clip = 1.0, None
        if self.reward_norm is not None:
            scale = 1.0 / math.sqrt(float(self.reward_norm.var) + 1e-8)
            clip = self.kw.clip_reward
        if self.cfg.policy.type == "appo":
            stats = self.learner.update_fragment(frags[0], self.version, scale, clip)
            if stats is None:
                # a dropped stale fragment changed no weight: publishing a new version would count a
                # non-update as policy lag for every fragment in flight and cascade into more drops
                lag = float(self.version - frags[0].policy_version)
                skipped = {"update_skipped": 1.0, "stale_dropped": float(self.learner.stale_dropped)}
                return self._end_iteration(frags, skipped, time.perf_counter() - t_update, policy_lag=lag)
            stats["update_skipped"] = 0.0
        else:
            buf = RolloutBuffer(frags)
            buf.compute_advantages(self.kw.gamma, self.kw.gae_lambda, scale, clip)
            stats = self.learner.update(buf, progress=min(1.0, self.env_steps / self.cfg.total_env_steps))
        self.version += 1
        self.backend.publish_weights(self.policy.state_dict(), self.version)
        return self._end_iteration(frags, stats, time.perf_counter() - t_update)

    def _end_iteration(self, frags: list, stats: dict[str, Any], update_s: float, policy_lag: float | None = None) -> bool:
        """Metrics, logs, checkpoint and eval after an update; True when stop_reward was reached.

        ``policy_lag`` defaults to the lag of ``frags`` against the one update just made."""
        cfg = self.cfg
        check_losses(stats, self.iteration + 1, self.env_steps)  # before its weights are checkpointed
        self.iteration += 1
        if policy_lag is None:
            policy_lag = float(np.mean([self.version - 1 - f.policy_version for f in frags]))
        now = self._elapsed()
        metrics = {"iteration": self.iteration, "env_steps": self.env_steps, "time_s": now,
                   "fps": (self.env_steps - self._last_steps) / max(1e-9, now - self._last_t),
                   **self.window.summary(), **stats,
                   "policy_lag": policy_lag,
                   "nonfinite_skipped_fragments": self.finite.skipped,
                   "connector/process_restarts": self.connector_process_restarts,
                   "connector/copies_restarted": self.connector_copies_restarted,
                   "learner/samples_per_s": sum(f.env_steps for f in frags) / max(1e-9, update_s),
                   **self.extra_metrics}
        if hasattr(self.backend, "metrics"):  # optional hook (ray: per-role throughput, queue depth, lag, restarts)
            metrics.update(self.backend.metrics())
        self._last_t, self._last_steps = now, self.env_steps
        if self.iteration % cfg.logging.log_interval == 0:
            self.logger.log(metrics, self.env_steps)
        if self.on_iteration is not None:
            self.on_iteration(metrics)
        if cfg.logging.checkpoint_freq and self.iteration % cfg.logging.checkpoint_freq == 0:
            self._save_checkpoint()
        if cfg.eval.every_n_iterations and self.iteration % cfg.eval.every_n_iterations == 0:
            self.evaluate(tag=f"iter_{self.iteration:08d}")
        mean = metrics["episode_reward_mean"]
        if cfg.stop_reward is not None and self.window.full and mean is not None and mean >= cfg.stop_reward:
            log.info("stop_reward %.4g reached at %d env steps", cfg.stop_reward, self.env_steps)
            return True
        return False

    def _save_checkpoint(self) -> None:
        self.checkpoints.save(self.iteration, self._state())

    def evaluate(self, tag: str = "final", episodes: int | None = None) -> dict[str, Any]:
        from polar.trainers.evaluation import evaluate_policy

        ev = self.cfg.eval
        res = evaluate_policy(self.policy, self.cfg.harness, episodes or ev.episodes, ev.seed, ev.deterministic,
                              ev.num_envs, self.cfg.config_dir)
        res.update(env_steps=self.env_steps, iteration=self.iteration)
        self.run_dir.write_json(f"eval/{tag}.json", res)
        return res
