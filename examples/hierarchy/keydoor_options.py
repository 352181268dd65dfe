"""Key-door level 3 (two rooms joined by one gap, key and door apart) as a Gymnasium env that reports subgoals.

``KeyDoorSubgoals-v0`` is the task of the hierarchy example (docs/hierarchy.md). Its reward is the game's own
(-0.01 a step, +0.2 for the first key pick-up, +1 for opening the door) and it is the same for the flat and the
hierarchical agent. Every step's ``info`` also says which subgoals hold (``subgoal_key``: the key is held,
``subgoal_door``: the door is open, ``subgoal_gap``: the agent stands in the gap of the middle wall): a hierarchical run ends a skill when its subgoal holds and pays the skill
its subgoal reward; a flat run ignores these keys.

``key_reward``: what picking up the key pays (the game's 0.2 by default; 0 leaves the door as the only reward, so
the key is a subgoal the env does not pay for). ``observation``: ``grid`` (the default: a wall/key/door plane and the agent's plane, flattened, plus the key held)
or ``coords`` (8 numbers: the agent's, the key's and the door's row and column, the gap's row, the key held; each
position divided by the grid's side), the same for both agents.

``size`` and ``key_apart`` make the long-horizon variant (``keydoor_apart_*.yaml``): ``size`` is the room's
interior side (level 3's 7 by default; 9 gives two 4x9 rooms), ``key_apart: true`` puts the key in the room the
door does not open from, so every episode needs the key, the gap and the door in that order (a door in the border
above or below the middle wall belongs to neither room; the key then stays where the game put it).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "keydoor"))
from keydoor_game import DOOR, EMPTY, KEY, KEY_REWARD, WALL, KeyDoorGame


class KeyDoorSubgoals(gym.Env[Any, int]):
    """``grid`` or ``coords`` observations (module docstring), 4 moves."""

    action_space = spaces.Discrete(4)

    def __init__(self, level: int = 3, max_steps: int | None = None, observation: str = "grid",
                 key_reward: float = KEY_REWARD, size: int | None = None, key_apart: bool = False) -> None:
        if observation not in ("grid", "coords"):
            raise ValueError(f"observation must be 'grid' or 'coords', got {observation!r}")
        self.game = KeyDoorGame(level=level, size=size)
        self.max_steps = int(max_steps or self.game.level.max_steps)
        self.observation = observation
        self.key_reward = float(key_reward)
        self.key_apart = bool(key_apart)
        if key_apart and not self.game.level.split_wall:
            raise ValueError(f"key_apart puts the key in the room without the door; level {level} has one room")
        h, w = self.game.shape
        if observation == "coords":
            self.observation_space = spaces.Box(0.0, 1.0, (8,), np.float32)
        else:
            self.observation_space = spaces.Dict({"grid": spaces.Box(-1.0, 1.0, (2 * h * w,), np.float32),
                                                  "inventory": spaces.Box(0.0, 1.0, (1,), np.float32)})
        self.t = 0
        self.key = (0, 0)
        self.gap = (-1, -1)

    def _coords(self) -> np.ndarray:
        n = float(self.game.shape[0])
        held = float(min(self.game.keys_held, 1))
        return np.array([*self.game.agent, *self.key, *self.game.door, max(self.gap[0], 0), 0.0], np.float32) / n + \
            np.array([0, 0, 0, 0, 0, 0, 0, held], np.float32)

    def _obs(self) -> Any:
        if self.observation == "coords":
            return self._coords()
        g = self.game.grid
        objects = np.where(g == WALL, -1.0, np.where(g == KEY, 0.5, np.where(g == DOOR, 1.0, 0.0))).astype(np.float32)
        agent = np.zeros(g.shape, np.float32)
        agent[self.game.agent] = 1.0
        return {"grid": np.concatenate([objects.ravel(), agent.ravel()]),
                "inventory": np.array([min(self.game.keys_held, 1)], np.float32)}

    def _subgoals(self) -> dict[str, bool]:
        return {"subgoal_key": self.game.keys_held > 0, "subgoal_door": self.game.won,
                "subgoal_gap": tuple(self.game.agent) == self.gap}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.game.new_game(None if seed is None else int(seed))
        self.t = 0
        g = self.game.grid
        col = g.shape[1] // 2
        rows = [r for r in range(1, g.shape[0] - 1) if g[r, col] != WALL] if self.game.level.split_wall else []
        self.gap = (rows[0], col) if rows else (-1, -1)  # the one opening in the middle wall (level 3)
        if self.key_apart:
            self._move_key_apart()
        found = np.argwhere(self.game.grid == KEY)
        self.key = (int(found[0][0]), int(found[0][1])) if len(found) else self.game.agent
        return self._obs(), self._subgoals()

    def _move_key_apart(self) -> None:
        """Put the key on a random free cell of the room the door does not open from (with the game's seeded
        rng), so every episode needs key, gap and door in that order. A door in the border above or below the
        middle wall belongs to neither room and leaves the key where the game put it."""
        g = self.game.grid
        col = g.shape[1] // 2
        door_col = self.game.door[1]
        if door_col == col:
            return
        cols = range(col + 1, g.shape[1] - 1) if door_col < col else range(1, col)
        free = [(r, c) for r in range(1, g.shape[0] - 1) for c in cols
                if g[r, c] == EMPTY and (r, c) != tuple(self.game.agent)]
        g[g == KEY] = EMPTY
        g[free[int(self.game.rng.integers(len(free)))]] = KEY

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        had_key = self.game.keys_held > 0
        over, reward = self.game.step(int(action))
        if self.game.keys_held > 0 and not had_key:  # the game paid KEY_REWARD for this pick-up
            reward += self.key_reward - KEY_REWARD
        self.t += 1
        truncated = not over and self.t >= self.max_steps
        info: dict[str, Any] = self._subgoals()
        if over or truncated:
            info["success"] = self.game.won
        return self._obs(), reward, over, truncated, info


if "KeyDoorSubgoals-v0" not in gym.registry:
    gym.register("KeyDoorSubgoals-v0", entry_point=KeyDoorSubgoals)
