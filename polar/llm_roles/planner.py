"""An LLM as planner: it writes subgoals in text; a goal-conditioned PPO controller pursues them in order.

**The subgoal interface.** A plan is text, one subgoal per line (numbering, bullets and extra words are
fine: ``1. pick up the key``). Each line must name exactly one word of the env's subgoal vocabulary
(key-door: ``key``, ``door``); lines that name none are ignored, a line that names two is an error, and a
plan with no subgoal is an error. :class:`SubgoalEnv` wraps a Dict-observation env that can tell whether a
subgoal is reached (``reached(subgoal) -> bool``): it adds ``obs["subgoal"]`` (a one-hot over the vocabulary;
all zeros once the plan is done), pays ``subgoal_reward`` each time the current subgoal is reached, and then
moves to the next one. The env's own reward is kept; ``info["subgoals_done"]`` counts progress.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from polar.errors import ConfigError

Ask = Callable[[list[dict[str, str]]], Awaitable[str]]


class PlanError(ConfigError):
    """A plan the controller cannot follow."""


def parse_plan(text: str, vocabulary: Sequence[str]) -> list[str]:
    """The ordered subgoals in ``text`` (one per line, each naming one vocabulary word)."""
    plan: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        words = set(re.findall(r"[a-z_]+", line.lower()))
        named = [v for v in vocabulary if v in words]
        if len(named) > 1:
            raise PlanError(f"plan line {n} {line.strip()!r} names {len(named)} subgoals ({', '.join(named)}); "
                            "write one subgoal per line")
        plan += named
    if not plan:
        raise PlanError(f"the plan names no subgoal; write one per line from: {', '.join(vocabulary)} "
                        f"(got {text.strip()[:120]!r})")
    return plan


def plan_prompt(description: str, vocabulary: Sequence[str]) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You plan for a low-level controller. Reply with the subgoals in order, "
             f"one per line, each naming exactly one of: {', '.join(vocabulary)}."},
            {"role": "user", "content": description}]


async def make_plan(ask: Ask, description: str, vocabulary: Sequence[str]) -> list[str]:
    """Ask the planning engine once; its reply parsed into subgoals (:class:`PlanError` when unusable)."""
    return parse_plan(await ask(plan_prompt(description, vocabulary)), vocabulary)


class SubgoalEnv(gym.Wrapper[Any, Any, Any, Any]):
    """``env`` conditioned on the plan's current subgoal (see the module docstring for the contract)."""

    def __init__(self, env: gym.Env[Any, Any], plan: Sequence[str], vocabulary: Sequence[str],
                 subgoal_reward: float = 0.5) -> None:
        super().__init__(env)
        unknown = [s for s in plan if s not in vocabulary]
        if unknown:
            raise PlanError(f"plan subgoal {unknown[0]!r} is not in the vocabulary {list(vocabulary)}")
        if not isinstance(env.observation_space, spaces.Dict):
            raise PlanError("SubgoalEnv needs a Dict observation space (it adds the 'subgoal' key)")
        self.plan, self.vocabulary, self.subgoal_reward = list(plan), list(vocabulary), float(subgoal_reward)
        self.observation_space = spaces.Dict({**env.observation_space.spaces,
                                              "subgoal": spaces.Box(0.0, 1.0, (len(vocabulary),), np.float32)})
        self.done_count = 0

    def _with_subgoal(self, obs: dict[str, Any]) -> dict[str, Any]:
        onehot: np.ndarray[Any, np.dtype[np.float32]] = np.zeros(len(self.vocabulary), dtype=np.float32)
        if self.done_count < len(self.plan):
            onehot[self.vocabulary.index(self.plan[self.done_count])] = 1.0
        return {**obs, "subgoal": onehot}

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self.done_count = 0
        return self._with_subgoal(obs), {**info, "subgoals_done": 0}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        bonus = 0.0
        base: Any = self.env.unwrapped
        if self.done_count < len(self.plan) and base.reached(self.plan[self.done_count]):
            self.done_count += 1
            bonus = self.subgoal_reward
        info = {**info, "subgoals_done": self.done_count}
        return self._with_subgoal(obs), float(reward) + bonus, terminated, truncated, info
