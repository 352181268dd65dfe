"""Key-door level 3 (two rooms, one gap, key and door apart) as a goal-conditioned Gymnasium env.

``PlannedKeyDoor-v0`` takes ``plan`` (text, as a planning LLM writes it) and wraps the game in
:class:`polar.llm_roles.planner.SubgoalEnv`: the controller sees ``obs["subgoal"]`` and earns a bonus for
reaching the key, then the door. Train it with ``polar run --config examples/llm_planner/controller_ppo.yaml``
(``run.py`` asks the planner first and passes its plan in).
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

from polar.llm_roles.planner import SubgoalEnv, parse_plan

VOCABULARY = ("key", "door")
DESCRIPTION = ("A grid of two rooms joined by one gap in a wall. The door is locked: walk onto the key first, then "
               "walk into the door. Subgoals: key, door.")


class KeyDoorEnv(gym.Env[dict[str, Any], int]):
    """Dict obs: ``grid`` (walls -1, key 0.5, door 1, agent plane) and ``inventory`` (key held); 4 moves."""

    action_space = spaces.Discrete(4)

    def __init__(self, level: int = 3) -> None:
        self.game = KeyDoorGame(level=level)
        h, w = self.game.shape
        self.observation_space = spaces.Dict({"grid": spaces.Box(-1.0, 1.0, (2 * h * w,), np.float32),
                                              "inventory": spaces.Box(0.0, 1.0, (1,), np.float32)})
        self.t = 0

    def reached(self, subgoal: str) -> bool:
        return self.game.keys_held > 0 if subgoal == "key" else self.game.won

    def _obs(self) -> dict[str, Any]:
        g = self.game.grid
        objects = np.where(g == WALL, -1.0, np.where(g == KEY, 0.5, np.where(g == DOOR, 1.0, 0.0))).astype(np.float32)
        agent = np.zeros(g.shape, np.float32)
        agent[self.game.agent] = 1.0
        return {"grid": np.concatenate([objects.ravel(), agent.ravel()]),
                "inventory": np.array([min(self.game.keys_held, 1)], np.float32)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.game.new_game(None if seed is None else int(seed))
        self.t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        over, reward = self.game.step(int(action))
        self.t += 1
        truncated = not over and self.t >= self.game.level.max_steps
        return self._obs(), reward, over, truncated, {"success": self.game.won} if over or truncated else {}


def make_planned(plan: str, level: int = 3, subgoal_reward: float = 0.5) -> SubgoalEnv:
    return SubgoalEnv(KeyDoorEnv(level), parse_plan(plan, VOCABULARY), VOCABULARY, subgoal_reward)


if "PlannedKeyDoor-v0" not in gym.registry:
    gym.register("PlannedKeyDoor-v0", entry_point=make_planned)
