"""Gymnasium action masks: ``action_mask`` in the observation Dict, or in ``info``, checked on every step.

An env that puts its mask in ``info`` is given a Dict observation ``{"observation": ..., "action_mask": ...}``,
so the mask travels with the observation through rollouts, the buffer, PPO's loss, evaluation and export,
and the built-in agent masks its logits from it (``polar.models.actor_critic``). Whichever place the mask
comes from, this wrapper refuses a mask that allows no action (naming the env and the step) and an action
the mask forbids: an illegal action never reaches the env.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from polar.distributions import ACTION_MASK_KEY
from polar.errors import AgentError, HarnessError


def check_mask(mask: Any, env_name: str, step: int, episode: int, agent: str | None = None) -> np.ndarray:
    """``mask`` as a bool vector, or a ``HarnessError`` when it allows no action."""
    legal = np.asarray(mask).astype(bool).reshape(-1)
    if not legal.any():
        who = f" for agent {agent!r}" if agent is not None else ""
        raise HarnessError(f"{env_name}: the action_mask{who} at step {step} of episode {episode} allows no action; "
                           "an env must allow at least one action at every step before the episode ends")
    return legal


def check_legal(action: Any, legal: np.ndarray, env_name: str, step: int, episode: int, agent: str | None = None) -> None:
    """An ``AgentError`` when ``action`` is one the last mask forbids."""
    a = int(np.asarray(action).reshape(()))
    if not 0 <= a < legal.shape[0] or not legal[a]:
        who = f" of agent {agent!r}" if agent is not None else ""
        raise AgentError(f"{env_name}: action {a}{who} at step {step} of episode {episode} is forbidden by the "
                         f"action_mask (legal: {np.flatnonzero(legal).tolist()}); the policy must mask its logits")


def mask_source(env: gym.Env) -> str | None:
    """``"obs"`` when the observation Dict has an ``action_mask``, ``"info"`` when ``reset()``'s info has one, else None."""
    space = env.observation_space
    if isinstance(space, gym.spaces.Dict) and ACTION_MASK_KEY in space.spaces:
        return "obs"
    if not isinstance(env.action_space, gym.spaces.Discrete):
        return None
    _, info = env.reset()
    return "info" if isinstance(info, dict) and ACTION_MASK_KEY in info else None


class ActionMaskGuard(gym.Wrapper):
    """Checks each mask and each action against it; moves an ``info`` mask into a Dict observation."""

    def __init__(self, env: gym.Env, env_name: str, source: str) -> None:
        super().__init__(env)
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise HarnessError(f"{env_name}: action masks need a Discrete action space, got {env.action_space}")
        self.env_name = env_name
        self.from_info = source == "info"
        if self.from_info:
            n = int(env.action_space.n)
            self.observation_space = gym.spaces.Dict({
                "observation": env.observation_space,
                ACTION_MASK_KEY: gym.spaces.Box(0, 1, (n,), np.int8)})
        self.legal: np.ndarray | None = None
        self.step_count = 0
        self.episode = 0

    def _observe(self, obs: Any, info: dict, done: bool) -> Any:
        if self.from_info:
            if ACTION_MASK_KEY not in info:
                raise HarnessError(f"{self.env_name}: info has no {ACTION_MASK_KEY!r} at step {self.step_count} of "
                                   f"episode {self.episode}, though reset() gave one; return it on every step")
            obs = {"observation": obs, ACTION_MASK_KEY: np.asarray(info[ACTION_MASK_KEY], np.int8)}
        if not done:  # a finished episode's last mask may be empty (a full board)
            self.legal = check_mask(obs[ACTION_MASK_KEY], self.env_name, self.step_count, self.episode)
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        if self.episode == 0 or self.step_count > 0:  # a reset straight after a reset starts no new episode
            self.episode += 1
        self.step_count = 0
        return self._observe(obs, info, False), info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        if self.legal is not None:
            check_legal(action, self.legal, self.env_name, self.step_count, self.episode)
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.step_count += 1
        return self._observe(obs, info, bool(terminated or truncated)), reward, terminated, truncated, info


def with_action_masks(env: gym.Env, env_name: str) -> gym.Env:
    """``env`` wrapped in ``ActionMaskGuard`` when it has action masks, else unchanged."""
    source = mask_source(env)
    return env if source is None else ActionMaskGuard(env, env_name, source)
