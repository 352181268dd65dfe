"""The dataset collector of offline runs (BC, IQL, CQL): minibatches sampled uniformly from a dataset's
transitions, ``Batch[list[OfflineBatch]]`` per collect (no env step, so ``env_steps`` stays 0)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from polar.algorithms.bc import OfflineBatch
from polar.datasets.minari import Transitions
from polar.errors import ConfigError
from polar.models.normalization import ObsNormalizer
from polar.types import Batch, Metrics

log = logging.getLogger(__name__)


class DatasetCollector:
    """Each ``collect()`` samples ``minibatches()`` minibatches of ``batch_size`` transitions (read each time:
    the last iteration stops at the run's gradient steps exactly)."""

    def __init__(self, data: Transitions, batch_size: int, minibatches: Callable[[], int], seed: int,
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
        self.return_mean = float(np.mean(data.episode_returns))

    def start(self, weights: Mapping[str, Any], version: int) -> None:
        pass

    def collect(self) -> Batch[list[OfflineBatch]]:
        t = self.tensors
        out = []
        n = self.minibatches()
        for _ in range(n):
            idx = torch.as_tensor(self.rng.integers(0, len(self.data), self.batch_size))
            out.append(OfflineBatch(t["obs"][idx], t["actions"][idx], t["rewards"][idx], t["next_obs"][idx],
                                    t["terminated"][idx]))
        self.sampled += n * self.batch_size
        return Batch(data=out, env_steps=0)

    def publish(self, weights: Mapping[str, Any], version: int) -> None:
        pass  # nothing acts between updates: evaluation reads the learner's own policy

    def metrics(self) -> Metrics:
        return {"dataset/transitions": len(self.data), "dataset/samples": self.sampled,
                "dataset/return_mean": self.return_mean}

    def close(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


def set_dataset_statistics(norm: ObsNormalizer, data: Transitions, obs_space: gym.Space[Any], algo: str) -> None:
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
