"""A one-step game whose observation and reward are its ``level``, and whose success is forced: every episode
succeeds below level ``stuck_at`` and fails from it on (what a curriculum test needs to advance on cue)."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces


class LevelConnector:
    observation_space = spaces.Box(0.0, 10.0, shape=(1,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, config: dict) -> None:
        self.level = int(config.get("level", 1))
        if not 1 <= self.level <= 3:
            raise ValueError(f"unknown level {self.level}; levels are 1, 2, 3")
        self.stuck_at = int(config.get("stuck_at", 99))

    def reset(self, seed: int | None = None):
        return np.array([self.level], np.float32)

    def step(self, action: int):
        obs = np.array([self.level], np.float32)
        return obs, float(self.level), True, False, {"success": self.level < self.stuck_at}

    def close(self) -> None:
        pass
