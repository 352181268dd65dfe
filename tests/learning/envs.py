"""Small Gymnasium envs for learning tests: each isolates one capability and has a clear solved level."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class ReachTargetEnv(gym.Env):
    """Continuous control: move a point on [-1, 1] to a random target in 10 steps.

    obs = (position, target); action = velocity in [-1, 1] (Box); reward = -|position - target| per step.
    Random actions score about -6 per episode; a good policy gets above -2.
    """

    observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = float(self.np_random.uniform(-1, 1))
        self.target = float(self.np_random.uniform(-1, 1))
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.pos, self.target], dtype=np.float32)

    def step(self, action):
        self.pos = float(np.clip(self.pos + 0.5 * float(np.asarray(action).reshape(-1)[0]), -1, 1))
        self.t += 1
        reward = -abs(self.pos - self.target)
        return self._obs(), reward, False, self.t >= 10, {}


class CueMemoryEnv(gym.Env):
    """Memory: a cue (+1 or -1) is shown only at the first step, then ``delay`` blank steps, then the agent
    must answer with the cue's action. obs = (cue, is_query). Reward +1 for the right answer, else 0;
    ``info["success"]`` at the end. Without memory the best success rate is 50%."""

    observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, delay: int = 4) -> None:
        self.delay = delay

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cue = int(self.np_random.integers(2))
        self.t = 0
        return np.array([1.0 if self.cue else -1.0, 0.0], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t <= self.delay:
            query = 1.0 if self.t == self.delay else 0.0
            return np.array([0.0, query], dtype=np.float32), 0.0, False, False, {}
        ok = int(action) == self.cue
        return np.zeros(2, dtype=np.float32), float(ok), True, False, {"success": ok}


class TimeoutValueEnv(gym.Env):
    """Reward 1 per step, never terminates, truncated after ``limit`` steps: a correct learner bootstraps the
    truncated step, so its values approach 1 / (1 - gamma) instead of collapsing near the time limit."""

    observation_space = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, limit: int = 5) -> None:
        self.limit = limit

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.5], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([0.5], dtype=np.float32), 1.0, False, self.t >= self.limit, {}


def register() -> None:
    for name, cls in [("PolarReachTarget-v0", ReachTargetEnv), ("PolarCueMemory-v0", CueMemoryEnv),
                      ("PolarTimeoutValue-v0", TimeoutValueEnv)]:
        if name not in gym.registry:
            gym.register(name, entry_point=cls)
