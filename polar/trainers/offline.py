"""Offline runs (BC, IQL, CQL): the one loop (``polar.trainers.loop``) fed by a dataset instead of envs.

``DatasetCollector`` is the Collector: each ``collect()`` samples ``steps_per_iteration`` minibatches of the
dataset's transitions (no env step, so ``env_steps`` stays 0); the learner (``polar.algorithms.bc`` /
``iql`` / ``cql``) takes a gradient step on each. The run's budget is ``policy.kwargs.gradient_steps``. The env harness
is made once at the start to check the dataset's spaces against it, and again only to evaluate
(``eval.every_n_iterations``, ``eval.at_end``), so a bad dataset fails before the first update.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from polar.algorithms.bc import BCLearner, OfflineBatch
from polar.algorithms.cql import CQLLearner, DiscreteCQLLearner
from polar.algorithms.iql import IQLLearner
from polar.config.policy import OFFLINE
from polar.config.run import EnvRunConfig
from polar.datasets.minari import Transitions, load_dataset
from polar.errors import ConfigError
from polar.models.normalization import ObsNormalizer
from polar.models.policy import build_policy
from polar.trainers.loop import Metrics, OnIteration, TrainingLoop
from polar.trainers.run_dir import RunDir
from polar.types import Batch

log = logging.getLogger(__name__)


class DatasetCollector:
    """The Collector of offline runs: minibatches sampled uniformly from a dataset's transitions."""

    def __init__(self, data: Transitions, batch_size: int, minibatches: int, seed: int,
                 obs_norm: ObsNormalizer | None = None) -> None:
        self.data = data
        self.batch_size = batch_size
        self.minibatches = minibatches
        self.rng = np.random.default_rng(seed)
        discrete = isinstance(data.action_space, gym.spaces.Discrete)
        obs, next_obs = torch.as_tensor(data.obs), torch.as_tensor(data.next_obs)
        if obs_norm is not None:  # frozen statistics: normalising the whole dataset once is normalising each batch
            with torch.no_grad():
                obs, next_obs = obs_norm(obs), obs_norm(next_obs)
        self.tensors = {"obs": obs, "next_obs": next_obs,
                        "actions": torch.as_tensor(data.actions.astype(np.int64 if discrete else np.float32)),
                        "rewards": torch.as_tensor(data.rewards), "terminated": torch.as_tensor(data.terminated)}
        self.sampled = 0

    def start(self, weights: Mapping[str, Any], version: int) -> None:
        pass

    def collect(self) -> Batch:
        t = self.tensors
        out = []
        for _ in range(self.minibatches):
            idx = torch.as_tensor(self.rng.integers(0, len(self.data), self.batch_size))
            out.append(OfflineBatch(t["obs"][idx], t["actions"][idx], t["rewards"][idx], t["next_obs"][idx],
                                    t["terminated"][idx]))
        self.sampled += self.minibatches * self.batch_size
        return Batch(data=out, env_steps=0)

    def publish(self, weights: Mapping[str, Any], version: int) -> None:
        pass  # nothing acts between updates: evaluation reads the learner's own policy

    def metrics(self) -> Metrics:
        return {"dataset/transitions": len(self.data), "dataset/samples": self.sampled}

    def close(self) -> None:
        pass


def set_dataset_statistics(norm: ObsNormalizer, data: Transitions, obs_space: gym.Space, algo: str) -> None:
    """``policy.kwargs.normalize_obs``: the normalizer takes the dataset's observation mean/std, once. Nothing
    updates them afterwards (offline runs fold no env moments in), so training, evaluation and the checkpoint,
    hence ``polar eval`` / ``export`` / ``serve``, all see the same standardisation."""
    if norm.is_dict or norm.norm is None:
        raise ConfigError(f"policy.kwargs.normalize_obs: policy.type {algo!r} standardises float vector observations; "
                          f"the env's are {obs_space} (images or integers); set policy.kwargs.normalize_obs: false")
    norm.set_from_data(data.obs)
    mean, var = norm.norm.mean.numpy(), norm.norm.var.numpy()
    log.info("observations standardised by the dataset's mean %s and std %s", np.round(mean, 4).tolist(),
             np.round(np.sqrt(var), 4).tolist())


OfflineLearner = BCLearner | CQLLearner | DiscreteCQLLearner  # IQLLearner is a BCLearner


def make_offline_learner(cfg: EnvRunConfig, agent: Any, obs_space: gym.Space, act_space: gym.Space) -> OfflineLearner:
    """The learner of ``cfg.policy.type`` (bc, iql, cql) for ``agent`` (what ``build_policy`` made for it)."""
    kw: Any = cfg.policy.kwargs
    if cfg.policy.type == "iql":
        return IQLLearner(agent, kw, obs_space, act_space)
    if cfg.policy.type == "cql":
        if isinstance(act_space, gym.spaces.Discrete):
            return DiscreteCQLLearner(agent, kw)
        from polar.models.off_policy import QCritic, network_settings

        hidden, activation, _ = network_settings(cfg)
        critic_hidden = list(kw.critic_hidden or hidden)
        return CQLLearner(agent, kw, lambda: QCritic(obs_space, act_space, critic_hidden, activation, []), act_space)
    return BCLearner(agent, kw)


class OfflineTrainer(TrainingLoop):
    """BC / IQL of a classic agent (``agent:``), or CQL of DQN's / SAC's networks, on ``policy.kwargs.dataset``;
    evaluated on the env harness."""

    cfg: EnvRunConfig

    def __init__(self, cfg: EnvRunConfig, run_dir: RunDir, resume: bool = False, on_iteration: OnIteration | None = None,
                 extra_metrics: Metrics | None = None) -> None:
        if cfg.policy.type not in OFFLINE:
            raise ConfigError(f"policy.type: OfflineTrainer runs {' or '.join(map(repr, OFFLINE))}, got {cfg.policy.type!r}")
        if cfg.distribution.backend != "local":
            raise ConfigError(f"policy.type {cfg.policy.type!r} trains from a dataset in this process; "
                              "set distribution.backend: local")
        super().__init__(cfg, run_dir, resume, on_iteration, extra_metrics)
        self.kw: Any = cfg.policy.kwargs

    def _build(self, state: dict[str, Any] | None) -> None:
        from polar.harness import make_vector_env

        cfg, kw = self.cfg, self.kw
        torch.set_num_threads(1)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        probe = make_vector_env(cfg.harness, 1, seed=cfg.seed, config_dir=cfg.config_dir)
        try:
            obs_space, act_space = probe.single_observation_space, probe.single_action_space
        finally:
            probe.close()
        if not isinstance(obs_space, gym.spaces.Box):
            raise ConfigError(f"policy.type {cfg.policy.type!r}: offline training takes Box observations; the env's "
                              f"are {obs_space}")
        data = load_dataset(kw.dataset, cfg.config_dir, obs_space, act_space, where="policy.kwargs.dataset")
        log.info("dataset %s: %d transitions, %d episodes (return mean %.4g)", data.dataset_id, len(data),
                 len(data.episode_returns), float(np.mean(data.episode_returns)))
        self.policy = build_policy(cfg, obs_space, act_space, cfg.config_dir)
        if self.policy.obs_norm is not None:
            set_dataset_statistics(self.policy.obs_norm, data, obs_space, cfg.policy.type)
        self.learner = make_offline_learner(cfg, self.policy.agent, obs_space, act_space)
        if state is not None:
            self._load_state(state)
        seed = cfg.seed if state is None else cfg.seed + 104_729 * (int(state["iteration"]) + 1)
        remaining = max(1, min(kw.steps_per_iteration, kw.gradient_steps - self.learner.n_updates))
        self.dataset = DatasetCollector(data, kw.batch_size, remaining, seed, self.policy.obs_norm)
        self.collector = self.dataset
        self.dataset_return_mean = float(np.mean(data.episode_returns))

    def update(self, batch: Batch) -> Metrics:
        self.policy.train()
        stats = self.learner.train(batch.data)
        # the next iteration's count, so the last one stops at gradient_steps exactly
        self.dataset.minibatches = max(1, min(self.kw.steps_per_iteration, self.kw.gradient_steps - self.learner.n_updates))
        return stats

    def weights(self) -> Mapping[str, Any]:
        return {}

    def learner_state(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "learner": self.learner.state_dict()}

    def load_learner_state(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.learner.load_state_dict(state["learner"])

    def finished(self) -> bool:
        return self.learner.n_updates >= self.kw.gradient_steps

    def row_metrics(self, batches: list[Batch], stats: Metrics) -> Metrics:
        return {"dataset/return_mean": self.dataset_return_mean}

    def evaluate(self, tag: str = "final", episodes: int | None = None) -> dict[str, Any]:
        from polar.trainers.evaluation import evaluate_policy

        ev = self.cfg.eval
        self.policy.eval()
        res = evaluate_policy(self.policy, self.cfg.harness, episodes or ev.episodes, ev.seed, ev.deterministic,
                              ev.num_envs, self.cfg.config_dir)
        res.update(env_steps=0, iteration=self.iteration, gradient_steps=self.learner.n_updates)
        self.run_dir.write_json(f"eval/{tag}.json", res)
        return res

    def periodic_eval(self) -> Metrics:
        every = self.cfg.eval.every_n_iterations
        if every and self.iteration % every == 0:
            res = self.evaluate(tag=f"iter_{self.iteration:08d}")
            return {"eval/return_mean": res.get("return_mean")}
        return {}

    def final_eval(self) -> dict[str, Any]:
        return {"eval": self.evaluate(tag="final")} if self.cfg.eval.at_end else {}
