"""A tiny env whose subgoal timing does not depend on the actions, for the option mechanics tests."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class Tick(gym.Env[np.ndarray, int]):
    """obs = [t / 100]; the subgoal 'tick' holds at every multiple of 5 steps; 'never' never holds; episodes end
    truncated after ``length`` steps (``info["success"]`` True). Reward 1 per step, whatever the action."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int = 50, report: bool = True) -> None:
        self.length, self.report, self.t = length, report, 0

    def _info(self) -> dict[str, Any]:
        return {"subgoal_tick": self.t % 5 == 0, "subgoal_never": False} if self.report else {}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), self._info()

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        trunc = self.t >= self.length
        info = self._info()
        if trunc:
            info["success"] = True
        return np.array([min(self.t / 100, 1.0)], np.float32), 1.0, False, trunc, info


if "HierTick-v0" not in gym.registry:
    gym.register("HierTick-v0", entry_point=Tick)


class Press(gym.Env[np.ndarray, int]):
    """Four actions; the subgoal 'press' holds right after action ``button`` (then the next step clears it). A
    skill paid for reaching it learns to press; the env's own reward is 0. Episodes last 32 steps."""

    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(4)

    def __init__(self, button: int = 2) -> None:
        self.button, self.t, self.pressed = button, 0, False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t, self.pressed = 0, False
        return np.array([0.0, 0.0], np.float32), {"subgoal_press": False}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        self.pressed = int(action) == self.button
        trunc = self.t >= 32
        return (np.array([self.t / 32, float(self.pressed)], np.float32), 0.0, False, trunc,
                {"subgoal_press": self.pressed})


if "HierPress-v0" not in gym.registry:
    gym.register("HierPress-v0", entry_point=Press)
