"""Key-door level 3 (two rooms joined by one gap, key and door apart) as a Gymnasium env that reports subgoals.

``KeyDoorSubgoals-v0`` is the task of the hierarchy example (docs/hierarchy.md). Its reward is the game's own
(-0.01 a step, +0.2 for the first key pick-up, +1 for opening the door) and it is the same for the flat and the
hierarchical agent. Every step's ``info`` also says which subgoals hold (``subgoal_key``: the key is held,
``subgoal_door``: the door is open): a hierarchical run ends a skill when its subgoal holds and pays the skill
its subgoal reward; a flat run ignores these keys.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "keydoor"))
from keydoor_game import DOOR, KEY, WALL, KeyDoorGame


class KeyDoorSubgoals(gym.Env[dict[str, Any], int]):
    """Dict obs: ``grid`` (walls -1, key 0.5, door 1; then the agent's plane) and ``inventory`` (key held); 4 moves."""

    action_space = spaces.Discrete(4)

    def __init__(self, level: int = 3, max_steps: int | None = None) -> None:
        self.game = KeyDoorGame(level=level)
        self.max_steps = int(max_steps or self.game.level.max_steps)
        h, w = self.game.shape
        self.observation_space = spaces.Dict({"grid": spaces.Box(-1.0, 1.0, (2 * h * w,), np.float32),
                                              "inventory": spaces.Box(0.0, 1.0, (1,), np.float32)})
        self.t = 0

    def _obs(self) -> dict[str, Any]:
        g = self.game.grid
        objects = np.where(g == WALL, -1.0, np.where(g == KEY, 0.5, np.where(g == DOOR, 1.0, 0.0))).astype(np.float32)
        agent = np.zeros(g.shape, np.float32)
        agent[self.game.agent] = 1.0
        return {"grid": np.concatenate([objects.ravel(), agent.ravel()]),
                "inventory": np.array([min(self.game.keys_held, 1)], np.float32)}

    def _subgoals(self) -> dict[str, bool]:
        return {"subgoal_key": self.game.keys_held > 0, "subgoal_door": self.game.won}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.game.new_game(None if seed is None else int(seed))
        self.t = 0
        return self._obs(), self._subgoals()

    def step(self, action: int) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        over, reward = self.game.step(int(action))
        self.t += 1
        truncated = not over and self.t >= self.max_steps
        info: dict[str, Any] = self._subgoals()
        if over or truncated:
            info["success"] = self.game.won
        return self._obs(), reward, over, truncated, info


if "KeyDoorSubgoals-v0" not in gym.registry:
    gym.register("KeyDoorSubgoals-v0", entry_point=KeyDoorSubgoals)
