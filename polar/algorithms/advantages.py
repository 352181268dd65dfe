"""Advantage estimation for on-policy learners: GAE over a time-major rollout, and normalization.

The learner calls these on the rollout it is about to learn from; the buffer only stores the
rollout (``polar.buffers.rollout_buffer``), so storage knows nothing about any algorithm.
"""

from __future__ import annotations

import numpy as np
import torch


def compute_gae(rewards, values, dones, last_values, gamma, gae_lambda: float):
    """Advantages and returns, ``[T, N]`` (numpy arrays or torch tensors; same type back).

    ``dones[t]`` ends the episode at step t (the step's target is then just its reward; truncated
    episodes must already carry ``gamma * V(final_obs)`` in their reward). ``last_values`` is V of the
    observation after the last step. ``gamma`` is a float, or one discount per step ``[T, N]`` (an SMDP:
    ``gamma ** tau`` for a step that lasted tau env steps, ``rollout_gae``). Runs in numpy: T tiny vector
    ops are cheaper there than in torch.
    """
    is_torch = isinstance(rewards, torch.Tensor)
    r, v, d, last = (x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in (rewards, values, dones, last_values))
    per_step = not isinstance(gamma, float | int)
    discounts = (gamma.numpy() if isinstance(gamma, torch.Tensor) else np.asarray(gamma)) if per_step else None
    T = r.shape[0]
    adv = np.empty_like(r)
    not_done = 1.0 - d
    gae = np.zeros_like(last)
    next_values = last
    for t in range(T - 1, -1, -1):
        g = discounts[t] if discounts is not None else gamma
        delta = r[t] + g * next_values * not_done[t] - v[t]
        gae = delta + g * gae_lambda * not_done[t] * gae
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
    from ``V(final_obs)`` (``trunc_values``) so a time limit does not look like a terminal state. A rollout
    whose steps are options (a hierarchical manager's decisions) carries ``durations`` ``[T, N]``, the env
    steps each lasted (tau); each step is then discounted by ``gamma ** tau`` (SMDP), its reward being the
    option's discounted return.
    """
    rewards = rollout.rewards * reward_scale
    if clip_reward is not None:
        rewards = rewards.clamp(-clip_reward, clip_reward)
    durations = getattr(rollout, "durations", None)
    discount = gamma if durations is None else torch.pow(torch.as_tensor(gamma, dtype=rewards.dtype), durations)
    rewards = rewards + discount * rollout.trunc_values
    dones = torch.maximum(rollout.terminated, rollout.truncated)
    return compute_gae(rewards, rollout.values, dones, rollout.last_values, discount, gae_lambda)


def normalize(advantages: torch.Tensor) -> torch.Tensor:
    """Zero mean, unit std (a single sample is left as it is)."""
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8) if advantages.numel() > 1 else advantages


__all__ = ["compute_gae", "normalize", "rollout_gae"]
