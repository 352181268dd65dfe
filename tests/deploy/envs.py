"""Small envs with the observation kinds the exporter must handle: uint8 images and a Dict of image + vector."""

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class _Base(gym.Env):
    """Reward 1 per step; episodes of 20 steps; observations from a seeded RNG."""

    def __init__(self, continuous: bool = False, multi: bool = False) -> None:
        if multi:
            self.action_space = spaces.MultiDiscrete([3, 2])
        else:
            self.action_space = spaces.Box(-2.0, 2.0, (2,), np.float32) if continuous else spaces.Discrete(3)
        self.t = 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, False, self.t >= 20, {}


class ImageEnv(_Base):
    def __init__(self, continuous: bool = False, multi: bool = False) -> None:
        super().__init__(continuous, multi)
        self.observation_space = spaces.Box(0, 255, (16, 16, 3), np.uint8)

    def _obs(self):
        return self.np_random.integers(0, 256, (16, 16, 3), dtype=np.uint8)


class DictEnv(_Base):
    def __init__(self, continuous: bool = False, multi: bool = False) -> None:
        super().__init__(continuous, multi)
        self.observation_space = spaces.Dict({
            "pixels": spaces.Box(0, 255, (8, 8, 1), np.uint8),
            "pos": spaces.Box(-5.0, 5.0, (3,), np.float32),
            "mode": spaces.Discrete(4),
        })

    def _obs(self):
        return {"pixels": self.np_random.integers(0, 256, (8, 8, 1), dtype=np.uint8),
                "pos": self.np_random.uniform(-5, 5, 3).astype(np.float32),
                "mode": int(self.np_random.integers(4))}


gym.register("PolarDeployImage-v0", entry_point=ImageEnv)
gym.register("PolarDeployDict-v0", entry_point=DictEnv)
