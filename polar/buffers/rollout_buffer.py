"""On-policy rollout buffer: fragments -> one time-major batch -> minibatches. Plain storage.

Fragments from different workers are joined along the env axis (each column is one env's
contiguous T steps), so GAE and recurrent sequence replay never cross workers. The learner computes
the advantages and returns (``polar.algorithms.advantages``) and stores them here before it asks
for minibatches.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import torch

from polar.agents import map_state
from polar.types import Fragment

ObsTensor: TypeAlias = "torch.Tensor | dict[str, torch.Tensor]"


def _cat(arrays: list[np.ndarray], axis: int) -> torch.Tensor:
    return torch.from_numpy(arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=axis))


def _index_obs(obs: ObsTensor, idx: torch.Tensor) -> ObsTensor:
    if isinstance(obs, dict):
        return {k: v[idx] for k, v in obs.items()}
    return obs[idx]


@dataclass
class Minibatch:
    obs: Any
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    initial_state: Any = None
    episode_starts: torch.Tensor | None = None


class RolloutBuffer:
    """Holds one PPO batch as torch tensors ``[T, N, ...]`` (N = all envs of all fragments)."""

    def __init__(self, fragments: list[Fragment]) -> None:
        f0 = fragments[0]
        steps = {f.num_steps for f in fragments}
        if len(steps) != 1:
            raise ValueError(f"fragments have different lengths {sorted(steps)}")
        if isinstance(f0.obs, dict):
            self.obs = {k: _cat([f.obs[k] for f in fragments], 1) for k in f0.obs}
        else:
            self.obs = _cat([f.obs for f in fragments], 1)
        self.actions = _cat([f.actions for f in fragments], 1)
        self.log_probs = _cat([f.log_probs for f in fragments], 1)
        self.values = _cat([f.values for f in fragments], 1)
        self.rewards = _cat([f.rewards for f in fragments], 1)
        self.terminated = _cat([f.terminated for f in fragments], 1)
        self.truncated = _cat([f.truncated for f in fragments], 1)
        self.episode_starts = _cat([f.episode_starts for f in fragments], 1)
        self.trunc_values = _cat([f.trunc_values for f in fragments], 1)
        self.last_values = _cat([f.last_values for f in fragments], 0)
        # the observation each step reached (final ones where episodes ended), when the run keeps it (RND)
        self.next_obs: ObsTensor | None = None
        if f0.next_obs is not None:
            self.next_obs = ({k: _cat([f.next_obs[k] for f in fragments], 1) for k in f0.next_obs}
                             if isinstance(f0.next_obs, dict) else _cat([f.next_obs for f in fragments], 1))
        # env steps per step when steps are options (SMDP discounting in polar.algorithms.advantages), else None
        self.durations: torch.Tensor | None = None
        if f0.durations is not None:
            self.durations = _cat([np.asarray(f.durations, np.float32) for f in fragments], 1)
        self.initial_state: Any = None  # a tensor or a tuple of them (LSTM: h, c), or None
        if f0.initial_state is not None:
            def cat_state(*parts: np.ndarray) -> torch.Tensor:
                return torch.from_numpy(np.concatenate(parts, 0))
            states = [f.initial_state for f in fragments]
            if isinstance(states[0], (tuple, list)):
                self.initial_state = tuple(cat_state(*[s[i] for s in states]) for i in range(len(states[0])))
            else:
                self.initial_state = cat_state(*states)
        self.num_steps, self.num_envs = self.rewards.shape
        self.advantages: torch.Tensor | None = None  # [T, N], set by the learner before minibatches
        self.returns: torch.Tensor | None = None

    def to(self, device: torch.device) -> RolloutBuffer:
        """Every tensor (advantages and returns too, once set) on ``device``, in place; a no-op on CPU."""
        if device.type == "cpu":
            return self
        for name in ("obs", "actions", "log_probs", "values", "rewards", "terminated", "truncated", "episode_starts",
                     "trunc_values", "last_values", "advantages", "returns", "initial_state", "next_obs"):
            setattr(self, name, map_state(lambda t: t.to(device, non_blocking=True), getattr(self, name)))
        return self

    @property
    def num_samples(self) -> int:
        return self.num_steps * self.num_envs

    def _require_targets(self) -> None:
        if self.advantages is None or self.returns is None:
            raise RuntimeError("RolloutBuffer: advantages/returns are not set; the learner stores them first "
                               "(polar.algorithms.advantages.rollout_gae) before asking for minibatches")

    def _flat(self) -> tuple[ObsTensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        self._require_targets()
        assert self.advantages is not None and self.returns is not None
        n = self.num_samples
        obs = {k: v.reshape(n, *v.shape[2:]) for k, v in self.obs.items()} if isinstance(self.obs, dict) else self.obs.reshape(n, *self.obs.shape[2:])
        return (obs, self.actions.reshape(n, *self.actions.shape[2:]), self.log_probs.reshape(n), self.values.reshape(n),
                self.advantages.reshape(n), self.returns.reshape(n))

    def minibatches(self, size: int) -> Iterator[Minibatch]:
        """Shuffled flat minibatches of ``size`` samples (the last smaller one is dropped unless it is the only one)."""
        obs, actions, logp, values, adv, ret = self._flat()
        n = self.num_samples
        if size >= n:
            yield Minibatch(obs, actions, logp, values, adv, ret)
            return
        perm = torch.randperm(n)
        for start in range(0, n - size + 1, size):
            idx = perm[start:start + size]
            yield Minibatch(_index_obs(obs, idx), actions[idx], logp[idx], values[idx], adv[idx], ret[idx])

    def sequence_minibatches(self, num_columns: int) -> Iterator[Minibatch]:
        """Minibatches of whole env columns ``[T, B]`` with their initial state, for recurrent replay."""
        self._require_targets()
        assert self.advantages is not None and self.returns is not None
        perm = torch.randperm(self.num_envs)
        for start in range(0, self.num_envs, num_columns):
            idx = perm[start:start + num_columns]
            obs = {k: v[:, idx] for k, v in self.obs.items()} if isinstance(self.obs, dict) else self.obs[:, idx]
            yield Minibatch(obs, self.actions[:, idx], self.log_probs[:, idx], self.values[:, idx],
                            self.advantages[:, idx], self.returns[:, idx],
                            initial_state=map_state(lambda s, i=idx: s[i], self.initial_state),
                            episode_starts=self.episode_starts[:, idx])
