"""Env runs (Gymnasium, connector and text envs): the fragment Collector, and what PPO, APPO, DQN and SAC
share around ``polar.trainers.loop``: the rollout backend, the policy, seeds, normalizers and evaluation.

``on_policy.py`` (PPO, APPO) and ``off_policy.py`` (DQN, SAC) add the algorithm's update.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from polar.config.run import EnvRunConfig
from polar.errors import ConfigError
from polar.models.normalization import RunningNorm
from polar.models.policy import build_policy
from polar.rollout.backends.base import RolloutBackend, make_backend
from polar.trainers.continual import Continual
from polar.trainers.device import copy_weights, learner_copy, learner_device
from polar.trainers.finite import FiniteGuard, harness_name
from polar.trainers.loop import Metrics, OnIteration, TrainingLoop
from polar.trainers.run_dir import RunDir
from polar.types import Batch, Fragment

log = logging.getLogger(__name__)

BackendFactory = Callable[..., RolloutBackend]


class EnvCollector:
    """The Collector of env runs: ``fragments()`` fragments per batch from a rollout backend (local processes,
    or Ray actors), each with finite observations and rewards (``nonfinite: fail`` raises on the first other
    one, naming its source; ``skip`` drops it, counts it and tells ``on_dropped``)."""

    def __init__(self, backend: RolloutBackend, policy: Any, finite: FiniteGuard, fragments: Callable[[], int],
                 on_dropped: Callable[[Fragment], None] | None = None) -> None:
        self.backend = backend
        self.policy = policy
        self.finite = finite
        self.fragments = fragments
        self.on_dropped = on_dropped
        self.connector_process_restarts = 0
        self.connector_copies_restarted = 0
        self.collect_s_max = 0.0  # the slowest fragment since the last metrics row

    def start(self, weights: Mapping[str, Any], version: int) -> None:
        self.backend.start(dict(weights), version, policy=self.policy)

    def next_fragment(self) -> Fragment:
        while True:
            frag = self.backend.next_fragment()
            if self.finite.accept(frag):
                self.connector_process_restarts += frag.connector_process_restarts
                self.connector_copies_restarted += frag.connector_copies_restarted
                self.collect_s_max = max(self.collect_s_max, frag.collect_s)
                log.debug("fragment %s from worker %d (collected in %.3fs) received", frag.trace_id, frag.worker_id,
                          frag.collect_s, extra={"trace_id": frag.trace_id})  # the worker's line has the same id
                return frag
            if self.on_dropped is not None:
                self.on_dropped(frag)

    def collect(self) -> Batch:
        frags = [self.next_fragment() for _ in range(self.fragments())]
        return Batch(data=frags, env_steps=sum(f.env_steps for f in frags),
                     episode_returns=[r for f in frags for r in f.episode_returns],
                     episode_lengths=[n for f in frags for n in f.episode_lengths],
                     episode_successes=[s for f in frags for s in f.episode_successes],
                     policy_versions=[f.policy_version for f in frags])

    def publish(self, weights: Mapping[str, Any], version: int) -> None:
        self.backend.publish_weights(dict(weights), version)

    def metrics(self) -> Metrics:
        out: Metrics = {"nonfinite_skipped_fragments": self.finite.skipped,
                        "connector/process_restarts": self.connector_process_restarts,
                        "connector/copies_restarted": self.connector_copies_restarted,
                        # the slowest fragment since the last row: one slow connector copy or worker shows here
                        "rollout/fragment_collect_s_max": self.collect_s_max}
        self.collect_s_max = 0.0
        backend_metrics = getattr(self.backend, "metrics", None)
        if backend_metrics is not None:  # optional hook (ray: per-role throughput, queue depth, lag, restarts)
            out.update(backend_metrics())
        return out

    def close(self) -> None:
        self.backend.close()


class EnvTrainer(TrainingLoop):
    """An env run's learner: backend, policy and normalizers; subclasses add the algorithm.

    ``backend_factory`` (default ``make_backend``) lets the Ray learner actor run this same loop with its
    own backend options."""

    ALGORITHMS: tuple[str, ...] = ()

    cfg: EnvRunConfig

    def __init__(self, cfg: EnvRunConfig, run_dir: RunDir, resume: bool = False, on_iteration: OnIteration | None = None,
                 backend_factory: BackendFactory | None = None, extra_metrics: Metrics | None = None) -> None:
        if cfg.policy.type not in self.ALGORITHMS:
            raise ConfigError(f"policy.type: {type(self).__name__} runs {' or '.join(map(repr, self.ALGORITHMS))}, "
                              f"got {cfg.policy.type!r}")
        super().__init__(cfg, run_dir, resume, on_iteration, extra_metrics)
        self.kw: Any = cfg.policy.kwargs
        self.backend_factory = backend_factory or make_backend
        self.finite = FiniteGuard(cfg.nonfinite, harness_name(cfg.harness))  # NaN/inf: fail or skip
        self.reward_norm: RunningNorm | None = None
        self.continual: Continual | None = None

    # ------------------------------------------------------------------ per algorithm
    def _fragment_steps(self) -> int:
        """Steps per env in one fragment."""
        return int(self.kw.n_steps)

    def _fragments_per_batch(self) -> int:
        return 1

    def _make_learner(self) -> Any:
        raise NotImplementedError

    def _dropped(self, frag: Fragment) -> None:
        """Hook for a fragment ``nonfinite: skip`` dropped (the off-policy trainer's n-step windows forget it)."""

    def _check_settings(self) -> None:
        """Warnings about settings that work but likely not as meant (after the backend knows its envs)."""

    # ------------------------------------------------------------------ build
    def _build(self, state: dict[str, Any] | None) -> None:
        cfg = self.cfg
        # the one device rule of every learner (polar.trainers.device): CUDA for num_gpus >= 1 when present,
        # else CPU, with a log line when a GPU was asked for
        self.device = learner_device(cfg.distribution.num_gpus)
        if self.device.type != "cpu":
            log.info("distribution.num_gpus=%s: the %s learner trains on %s; rollouts and evaluation act with a "
                     "CPU copy of the policy", cfg.distribution.num_gpus, cfg.policy.type, self.device)
        torch.set_num_threads(1)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        # fresh env seeds on resume
        seed = cfg.seed if state is None else cfg.seed + 104_729 * (int(state["iteration"]) + 1)
        self.backend = self.backend_factory(cfg, self._fragment_steps(), seed, config_dir=cfg.config_dir)
        self._check_settings()
        try:
            self.policy = build_policy(cfg, self.backend.observation_space, self.backend.action_space, cfg.config_dir)
            # what the learner trains: the acting agent itself on CPU, a copy on the learner's device otherwise
            self.train_agent = learner_copy(self.policy.agent, self.device)
            self.learner = self._make_learner()
            if getattr(self.kw, "normalize_reward", False):
                self.reward_norm = RunningNorm((), self.kw.clip_reward)
            self.continual = Continual.create(self)  # init, eval.old_tasks (polar.trainers.continual)
            if state is not None:
                self._load_state(state)
            if self.continual is not None:
                self.continual.begin(state)
            attach = getattr(self.backend, "attach_run_dir", None)
            if attach is not None:  # ray: `polar scale RUN_DIR` resizes while running
                attach(self.run_dir.path)
            self.collector = EnvCollector(self.backend, self.policy, self.finite, self._fragments_per_batch,
                                          self._dropped)
            self.collector.start(self.policy.state_dict(), self.version)
        except BaseException:
            self.backend.close()
            raise

    # ------------------------------------------------------------------ budget and evaluation
    def finished(self) -> bool:
        return self.env_steps >= self.cfg.total_env_steps

    def stop_reward(self) -> float | None:
        return self.cfg.stop_reward

    def periodic_eval(self) -> Metrics:
        every = self.cfg.eval.every_n_iterations
        if every and self.iteration % every == 0:
            res = self.evaluate(tag=f"iter_{self.iteration:08d}")
            if self.continual is not None:  # eval/return_mean, old_task/return, forgetting
                return self.continual.metrics(res)
        return {}

    def final_eval(self) -> dict[str, Any]:
        out = {"eval": self.evaluate(tag="final")} if self.cfg.eval.at_end else {}
        if self.continual is not None:
            out["continual"] = self.continual.summary(out.get("eval"))
        return out

    # ------------------------------------------------------------------ the Learner seam, shared part
    def _count(self, batch: Batch) -> None:
        for f in batch.data:
            self._absorb(f)

    def _absorb(self, f: Fragment) -> None:
        """Count a fragment's steps and episodes, and fold its normalizer moments in."""
        self.env_steps += f.env_steps
        self.window.add(f.episode_returns, f.episode_lengths, f.episode_successes)
        if self.policy.obs_norm is not None and f.obs_moments is not None:
            self.policy.obs_norm.update_from_moments(f.obs_moments)
        if self.reward_norm is not None and f.return_moments is not None:
            self.reward_norm.update(*f.return_moments)

    def sync_acting_policy(self) -> None:
        """The learner's weights into the acting (CPU) policy; nothing to do when the learner trains it in place."""
        copy_weights(self.policy.agent, self.train_agent)

    def weights(self) -> Mapping[str, Any]:
        self.sync_acting_policy()
        # envs stepped in the learner act with its own tensors: no state dict to build per update
        return self.policy.state_dict() if self.backend.num_workers else {}

    def learner_state(self) -> dict[str, Any]:
        self.sync_acting_policy()
        return {"policy": self.policy.state_dict(), "learner": self.learner.state_dict(),
                "reward_norm": self.reward_norm.state_dict() if self.reward_norm is not None else None,
                **({"continual": self.continual.state_dict()} if self.continual is not None else {})}

    def load_learner_state(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        copy_weights(self.train_agent, self.policy.agent)
        self.learner.load_state_dict(state["learner"])
        if self.reward_norm is not None and state.get("reward_norm") is not None:
            self.reward_norm.load_state_dict(state["reward_norm"])
        if self.continual is not None:
            self.continual.load_state_dict(state.get("continual"))

    def evaluate(self, tag: str = "final", episodes: int | None = None) -> dict[str, Any]:
        from polar.trainers.evaluation import evaluate_policy

        ev = self.cfg.eval
        self.sync_acting_policy()
        res = evaluate_policy(self.policy, self.cfg.harness, episodes or ev.episodes, ev.seed, ev.deterministic,
                              ev.num_envs, self.cfg.config_dir)
        res.update(env_steps=self.env_steps, iteration=self.iteration)
        self.run_dir.write_json(f"eval/{tag}.json", res)
        return res
