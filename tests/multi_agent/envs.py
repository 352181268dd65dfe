"""Small PettingZoo envs for the multi-agent tests, named in configs as ``tests.multi_agent.envs:<function>``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv
from pettingzoo.classic import tictactoe_v3
from pettingzoo.utils import BaseWrapper

ROOT = Path(__file__).resolve().parents[2]
PLAYED: list[tuple[str, int, bool]] = []  # (agent, action, legal) of every move counting_tictactoe saw
LOWEST: list[bool] = []  # per move counting_tictactoe saw: was it the lowest-numbered legal square


class _CountingWrapper(BaseWrapper):
    """Records every move with whether its mask allowed it; PettingZoo's own TicTacToe would just end the game
    with -1 for an illegal move, so only a record tells that one was never played."""

    def step(self, action):
        agent = self.agent_selection
        if action is not None and not (self.terminations[agent] or self.truncations[agent]):
            mask = self.observe(agent)["action_mask"]
            PLAYED.append((agent, int(action), bool(mask[int(action)])))
            LOWEST.append(int(action) == int(np.flatnonzero(mask)[0]))
        super().step(action)


def counting_tictactoe(**kwargs):
    return _CountingWrapper(tictactoe_v3.env(**kwargs))


class Coop(ParallelEnv):
    """Two agents each see a one-hot target of their own (3 values); each step pays both agents the share of agents
    that played their target. Episodes are truncated after ``length`` steps. A random pair earns length / 3."""

    metadata = {"name": "coop_v0"}

    def __init__(self, length: int = 8, ghost_at: int = -1, late_joiner: bool = False, mismatched: bool = False):
        self.possible_agents = ["a", "b"]
        self.length = length
        self.ghost_at = ghost_at  # step at which an undeclared agent shows up (the bad-input test)
        self.late_joiner = late_joiner  # "b" joins at step 2
        self.mismatched = mismatched  # "b" sees a wider observation than "a"
        self.rng = np.random.default_rng(0)

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (4 if self.mismatched and agent == "b" else 3,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(3)

    def _obs(self):
        out = {}
        for a in self.agents:
            o = np.zeros(self.observation_space(a).shape, np.float32)
            o[self.targets[a]] = 1.0
            out[a] = o
        return out

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.agents = ["a"] if self.late_joiner else list(self.possible_agents)
        self.targets = {a: int(self.rng.integers(3)) for a in self.possible_agents}
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        hits = sum(int(actions[a]) == self.targets[a] for a in actions) / len(self.possible_agents)
        rewards = {a: float(hits) for a in self.agents}
        trunc = {a: self.t >= self.length for a in self.agents}
        terms = dict.fromkeys(self.agents, False)
        self.targets = {a: int(self.rng.integers(3)) for a in self.possible_agents}
        if self.t >= self.length:
            obs = self._obs()
            self.agents = []
            return obs, rewards, terms, trunc, {a: {} for a in obs}
        if self.late_joiner and self.t == 2:
            self.agents = list(self.possible_agents)
        if self.t == self.ghost_at:
            self.agents = [*self.agents, "ghost"]
            self.targets["ghost"] = 0
        return self._obs(), rewards, terms, trunc, {a: {} for a in self.agents}


def coop(**kwargs):
    return Coop(**kwargs)


class TurnTaking(ParallelEnv):
    """A turn-based Parallel env that observes only the mover (as a multi-agent connector may): "a" and "b" move in
    turn, ``moves`` moves in all, "a" first. The last move decides: action 1 pays its mover +1 and the other -1,
    action 0 the reverse. Every other step pays the mover 0.1 and the waiting agent 0.01."""

    metadata = {"name": "turn_taking_v0"}

    def __init__(self, moves: int = 3, silent_at: int = -1):
        self.possible_agents = ["a", "b"]
        self.moves = moves
        self.silent_at = silent_at  # the step after which nobody is observed (the bad-input test)

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (self.moves,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def _obs(self):
        o = np.zeros(self.moves, np.float32)
        o[self.t] = 1.0
        return {self.possible_agents[self.t % 2]: o}

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), {}

    def step(self, actions):
        (mover, action), = actions.items()
        other = "b" if mover == "a" else "a"
        self.t += 1
        if self.t < self.moves:
            obs = {} if self.t == self.silent_at else self._obs()
            return obs, {mover: 0.1, other: 0.01}, {mover: False}, {mover: False}, {}
        sign = 1.0 if int(action) == 1 else -1.0
        self.agents = []
        done = {"a": True, "b": True}
        return {}, {mover: sign, other: -sign}, done, {"a": False, "b": False}, {}


def turn_taking(**kwargs):
    return TurnTaking(**kwargs)
