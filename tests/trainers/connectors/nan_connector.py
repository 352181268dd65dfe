"""A connector whose copy ``nan_copy`` puts NaN into its reward or observation at step ``nan_at`` (once, or
from then on with ``nan_forever``): what a game with a division by zero sends."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces


class NanConnector:
    observation_space = spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, config: dict) -> None:
        self.copy = int(getattr(config, "vector_index", 0))
        self.bad = self.copy == int(config.get("nan_copy", 1))
        self.field = config.get("nan_field", "reward")
        self.at = int(config.get("nan_at", 20))
        self.forever = bool(config.get("nan_forever", True))
        self.steps = 0  # over the connector's life, across episodes
        self.t = 0

    def reset(self, seed: int | None = None):
        self.t = 0
        return np.zeros(3, np.float32)

    def step(self, action: int):
        self.steps += 1
        self.t += 1
        poisoned = self.bad and (self.steps >= self.at if self.forever else self.steps == self.at)
        obs = np.full(3, 0.1 * (int(action) - 0.5), np.float32)
        reward = float(action)
        if poisoned and self.field == "reward":
            reward = float("nan")
        if poisoned and self.field == "obs":
            obs[1] = np.inf
        return obs, reward, False, self.t >= 10, {}

    def close(self) -> None:
        pass
