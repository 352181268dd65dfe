"""Envs with Gymnasium action masks for the mask tests. Playing a forbidden action raises inside the env.

Action 4 (the jackpot) pays 5, every other legal action 1, but the jackpot is legal on a tenth of the
steps only: an agent that ignores the mask learns to play it and crashes the env.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class IllegalActionPlayed(RuntimeError):
    pass


class MaskedBandit(gym.Env):
    """``action_mask`` in the observation Dict (``mask_in: obs``) or in ``info`` (``mask_in: info``)."""

    def __init__(self, mask_in: str = "obs", empty_mask_at: int = -1) -> None:
        self.mask_in = mask_in
        self.empty_mask_at = empty_mask_at  # the step whose mask allows nothing (the bad-input test)
        self.action_space = spaces.Discrete(5)
        vec = spaces.Box(-1.0, 1.0, (5,), np.float32)
        if mask_in == "obs":
            self.observation_space = spaces.Dict({"observation": vec, "action_mask": spaces.Box(0, 1, (5,), np.int8)})
        else:
            self.observation_space = vec
        self.t = 0
        self.mask = np.ones(5, np.int8)
        self.illegal_played = 0

    def _new_mask(self) -> np.ndarray:
        mask = (self.np_random.random(5) < 0.5).astype(np.int8)
        mask[4] = self.np_random.random() < 0.1
        if not mask.any():
            mask[self.np_random.integers(4)] = 1
        if self.t == self.empty_mask_at:
            mask[:] = 0
        return mask

    def _out(self):
        self.mask = self._new_mask()
        vec = self.np_random.uniform(-1, 1, 5).astype(np.float32)
        if self.mask_in == "obs":
            return {"observation": vec, "action_mask": self.mask.copy()}, {}
        return vec, {"action_mask": self.mask.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._out()

    def step(self, action):
        a = int(action)
        if not self.mask[a]:
            self.illegal_played += 1
            raise IllegalActionPlayed(f"action {a} played at step {self.t}; legal: {np.flatnonzero(self.mask).tolist()}")
        self.t += 1
        obs, info = self._out()
        return obs, 5.0 if a == 4 else 1.0, False, self.t >= 16, info


gym.register("PolarMaskedBandit-v0", entry_point=MaskedBandit)
gym.register("PolarInfoMaskedBandit-v0", entry_point=MaskedBandit, kwargs={"mask_in": "info"})
