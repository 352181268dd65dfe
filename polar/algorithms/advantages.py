"""Advantage estimation for on-policy learners: GAE over a time-major rollout, and normalization.

The learner calls these on the rollout it is about to learn from; the buffer only stores the
rollout (``polar.buffers.rollout_buffer``), so storage knows nothing about any algorithm.
"""

from __future__ import annotations

import numpy as np
import torch


def compute_gae(rewards, values, dones, last_values, gamma: float, gae_lambda: float):
    """Advantages and returns, ``[T, N]`` (numpy arrays or torch tensors; same type back).

    ``dones[t]`` ends the episode at step t (the step's target is then just its reward; truncated
    episodes must already carry ``gamma * V(final_obs)`` in their reward). ``last_values`` is V of the
    observation after the last step. Runs in numpy: T tiny vector ops are cheaper there than in torch.
    """
    is_torch = isinstance(rewards, torch.Tensor)
    r, v, d, last = (x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in (rewards, values, dones, last_values))
    T = r.shape[0]
    adv = np.empty_like(r)
    not_done = 1.0 - d
    gae = np.zeros_like(last)
    next_values = last
    for t in range(T - 1, -1, -1):
        delta = r[t] + gamma * next_values * not_done[t] - v[t]
        gae = delta + gamma * gae_lambda * not_done[t] * gae
        adv[t] = gae
        next_values = v[t]
    ret = adv + v
    if is_torch:
        return torch.from_numpy(adv), torch.from_numpy(ret)
    return adv, ret


def rollout_gae(rollout, gamma: float, gae_lambda: float, reward_scale: float = 1.0,
                clip_reward: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns ``[T, N]`` of a stored rollout (a ``RolloutBuffer`` or anything with its fields).

    Rewards are scaled (reward normalization), optionally clipped, and truncated steps are bootstrapped
    from ``V(final_obs)`` (``trunc_values``) so a time limit does not look like a terminal state.
    """
    rewards = rollout.rewards * reward_scale
    if clip_reward is not None:
        rewards = rewards.clamp(-clip_reward, clip_reward)
    rewards = rewards + gamma * rollout.trunc_values
    dones = torch.maximum(rollout.terminated, rollout.truncated)
    return compute_gae(rewards, rollout.values, dones, rollout.last_values, gamma, gae_lambda)


def normalize(advantages: torch.Tensor) -> torch.Tensor:
    """Zero mean, unit std (a single sample is left as it is)."""
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8) if advantages.numel() > 1 else advantages


__all__ = ["compute_gae", "normalize", "rollout_gae"]
