"""PettingZoo AEC and Parallel envs (``harness: {type: pettingzoo}``) behind one stepping interface.

``EnvSlot`` drives one env copy: ``poll()`` says which agents must act now (AEC: the selected agent; Parallel:
every live agent the last step observed) and which agents' last actions have an outcome (their reward since they
acted, and whether their episode ended); ``act({agent: action})`` steps the env. A Parallel env may leave live
agents out of a step's observations (a turn-based game: only the mover is observed, as the multi-agent connector
protocol allows): such an agent waits, and its rewards add up until it acts again or its episode ends. AEC envs'
dead-agent steps (``step(None)``) are taken here. Each agent's ``action_mask`` is checked as in single-agent runs
(``polar.harness.action_mask``; multi-agent masks come in the observation Dict, as PettingZoo's classic games
put them): an empty mask or a forbidden action is an error naming the env and the step.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from polar.config.multi_agent import PettingZooHarnessConfig
from polar.distributions import ACTION_MASK_KEY
from polar.errors import ConfigError, HarnessError
from polar.harness.action_mask import check_legal, check_mask


def _import_pettingzoo() -> Any:
    try:
        import pettingzoo
    except ImportError:
        raise ConfigError("harness.type: pettingzoo needs the pettingzoo package: pip install 'polar-rl[marl]'") from None
    return pettingzoo


def make_pettingzoo_env(cfg: PettingZooHarnessConfig, config_dir: Path | None = None, seed: int | None = None,
                        index: int = 0) -> Any:  # a PettingZoo AEC or Parallel env (untyped)
    """The AEC or Parallel env ``cfg.id`` names (``package.module`` calls its ``env()``; ``module:function`` the
    function), or one copy of the multi-agent connector ``cfg.connector_spec`` (its process started in
    ``config_dir``, its config seed derived from ``seed``; ``index`` names it in messages)."""
    pz = _import_pettingzoo()
    if cfg.connector_spec is not None:
        from polar.harness.connector.multi_agent import ConnectorParallelEnv

        return ConnectorParallelEnv(cfg.connector_spec, config_dir, seed, index)
    assert cfg.id is not None  # the config has one of id and connector_spec
    module_name, _, fn_name = cfg.id.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"harness.id: cannot import {module_name!r} ({e}); name a PettingZoo env module "
                          "(pettingzoo.classic.tictactoe_v3) or module:function") from None
    fn = getattr(module, fn_name or "env", None)
    if not callable(fn):
        raise ConfigError(f"harness.id: {module_name!r} has no function {fn_name or 'env'!r}; name a PettingZoo env "
                          "module (it has env()) or module:function")
    env = fn(**cfg.env_kwargs)
    if not isinstance(env, (pz.AECEnv, pz.ParallelEnv)):
        raise ConfigError(f"harness.id: {cfg.id} returned {type(env).__name__}, not a PettingZoo AECEnv or ParallelEnv")
    return env


def agent_spaces(env: Any) -> dict[str, tuple[gym.Space, gym.Space]]:
    """agent id -> (observation space, action space), for every possible agent."""
    return {a: (env.observation_space(a), env.action_space(a)) for a in env.possible_agents}


@dataclass
class Outcome:
    """What followed an agent's last action: the reward since, and whether its episode ended (and how)."""

    agent: str
    reward: float
    terminated: bool
    truncated: bool
    obs: Any  # the agent's observation now (its final one when the episode ended)


class EnvSlot:
    """One env copy. ``poll() -> (outcomes, requests)``; ``act(actions)``; ``episode_over`` after the last agent left."""

    def __init__(self, env: Any, name: str, seed: int) -> None:
        pz = _import_pettingzoo()
        self.env = env
        self.name = name
        self.parallel = isinstance(env, pz.ParallelEnv)
        self.possible = set(env.possible_agents)
        self.seed = seed
        self.episode = 0
        self.step_count = 0
        self.legal: dict[str, np.ndarray] = {}
        self.episode_over = True
        self._outcomes: list[Outcome] = []
        self._obs: dict[str, Any] = {}
        self._pending: dict[str, float] = {}  # Parallel: reward since each agent's last action, not yet reported

    def reset(self) -> None:
        self.episode += 1
        self.step_count = 0
        self.legal = {}
        self._outcomes = []
        self._pending = {}
        seed = self.seed + self.episode
        if self.parallel:
            obs, _ = self.env.reset(seed=seed)
            self._obs = dict(obs)
        else:
            self.env.reset(seed=seed)
        self.episode_over = False

    def _check_agent(self, agent: str) -> None:
        if agent not in self.possible:
            raise HarnessError(f"{self.name}: agent {agent!r} appeared at step {self.step_count} of episode {self.episode} "
                               f"but is not one of possible_agents {sorted(self.possible)}; polar plays only agents the "
                               "env declares")

    def _request(self, agent: str, obs: Any) -> tuple[str, Any]:
        self._check_agent(agent)
        if isinstance(obs, dict) and ACTION_MASK_KEY in obs:
            self.legal[agent] = check_mask(obs[ACTION_MASK_KEY], self.name, self.step_count, self.episode, agent)
        return agent, obs

    def poll(self) -> tuple[list[Outcome], list[tuple[str, Any]]]:
        """Outcomes since the last ``act`` and the (agent, observation) pairs that must act now."""
        outcomes, self._outcomes = self._outcomes, []
        if self.parallel:
            if not self.env.agents:
                self.episode_over = True
                return outcomes, []
            acting = [a for a in self.env.agents if a in self._obs]
            for a in acting:  # the outcome of an agent's last action comes when it acts again (or its episode ends)
                if a in self._pending:
                    outcomes.append(Outcome(a, self._pending.pop(a), False, False, self._obs[a]))
            if not acting:
                raise HarnessError(f"{self.name}: at step {self.step_count} of episode {self.episode} no live agent "
                                   f"({', '.join(map(repr, self.env.agents))}) is observed, so none can act; a step must "
                                   "observe at least one live agent")
            return outcomes, [self._request(a, self._obs[a]) for a in acting]
        while True:
            if not self.env.agents:
                self.episode_over = True
                return outcomes, []
            agent = self.env.agent_selection
            self._check_agent(agent)
            obs, reward, term, trunc, _ = self.env.last()
            outcomes.append(Outcome(agent, float(reward), bool(term), bool(trunc), obs))
            if term or trunc:
                self.env.step(None)  # a finished agent's step: it leaves the env
                continue
            return outcomes, [self._request(agent, obs)]

    def act(self, actions: dict[str, Any]) -> None:
        for agent, action in actions.items():
            if agent in self.legal:
                check_legal(action, self.legal[agent], self.name, self.step_count, self.episode, agent)
        self.step_count += 1
        if not self.parallel:
            (agent, action), = actions.items()
            self.env.step(int(action) if np.ndim(action) == 0 else action)
            return
        obs, rewards, terms, truncs, _ = self.env.step(actions)
        self._obs = dict(obs)
        for a in (*self._obs, *rewards, *terms, *truncs):
            self._check_agent(a)
        for a in actions:
            self._pending.setdefault(a, 0.0)
        for a, r in rewards.items():
            self._pending[a] = self._pending.get(a, 0.0) + float(r)
        self._outcomes = []
        for a in list(self._pending):
            term, trunc = bool(terms.get(a, False)), bool(truncs.get(a, False))
            if term or trunc or a not in self.env.agents:  # one that left unflagged is cut: truncated
                self._outcomes.append(Outcome(a, self._pending.pop(a), term, not term, self._obs.get(a)))
        for a in self.env.agents:
            self._check_agent(a)

    def close(self) -> None:
        self.env.close()
