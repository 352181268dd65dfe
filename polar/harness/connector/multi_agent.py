"""A multi-agent connector (protocol 2, docs/connector-protocol.md section 7) as a PettingZoo ``ParallelEnv``.

``harness: {type: pettingzoo, connector_spec: {...}}`` runs a game written in any language through the
multi-agent messages: per-agent observations, rewards, terminations, truncations and action masks, one map per
copy. Each ``ConnectorParallelEnv`` is one copy in one connector process; the multi-agent collector makes one per
env copy, as it does for PettingZoo envs. A step observes only the agents that must act next (every live agent in
a simultaneous game, the mover in a turn-based one); ``polar.harness.pettingzoo_env.EnvSlot`` adds up a waiting
agent's rewards until it acts again. Every reply is checked: a bad frame is a one-line ``ProtocolError`` naming
the connector, the message, the field and the agent.

Multi-agent connectors are not restarted: a process that dies or hangs past ``call_timeout_s`` ends the run with
``ConnectorCrashed``, quoting its last lines.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from polar.distributions import ACTION_MASK_KEY
from polar.errors import ConfigError, ConnectorCrashed, ProtocolError
from polar.harness.connector.process import ConnectorProcess, ProcessFailed
from polar.harness.connector.spaces import conform, shape_mismatch, space_bytes, space_from_wire
from polar.harness.connector.wire import PROTOCOL_MULTI_AGENT

AgentMap = dict[str, Any]


class ConnectorParallelEnv(ParallelEnv):  # type: ignore[misc]  # pettingzoo is untyped
    """One copy of a multi-agent connector (module docstring)."""

    metadata = {"name": "polar_connector", "is_parallelizable": True}

    def __init__(self, spec: Any, config_dir: Path | None = None, seed: int | None = None, index: int = 0) -> None:
        self.proc = ConnectorProcess(spec, 1, config_dir, index=index, seed=seed)
        try:
            desc = self.proc.start()
            self._describe(desc)
        except BaseException:
            self.proc.close()
            raise
        self.agents: list[str] = []
        self._masked = bool(desc.get("action_masks"))

    # ------------------------------------------------------------------------------- spaces
    def _describe(self, desc: dict[str, Any]) -> None:
        name = self.proc.name
        if self.proc.protocol < PROTOCOL_MULTI_AGENT or not desc.get("multi_agent"):
            raise ConfigError(f"{name} is a single-agent connector (its hello says protocol {self.proc.protocol} and "
                              "its init reply has no multi_agent: true); run it with harness.type: custom, or "
                              "answer init as docs/connector-protocol.md section 7 says")
        agents = desc.get("possible_agents")
        if not isinstance(agents, list) or not agents or not all(isinstance(a, str) and a for a in agents):
            raise ProtocolError(f"{name}: the init reply's 'possible_agents' must be a non-empty list of agent ids "
                                f"(strings), got {agents!r:.120}")
        if len(set(agents)) != len(agents):
            raise ProtocolError(f"{name}: the init reply's 'possible_agents' names an agent twice: {agents}")
        self.possible_agents: list[str] = list(agents)
        masked = bool(desc.get("action_masks"))
        self._obs_spaces: dict[str, spaces.Space[Any]] = {}
        self._act_spaces: dict[str, spaces.Space[Any]] = {}
        for key, out in (("action_spaces", self._act_spaces), ("observation_spaces", self._obs_spaces)):
            given = desc.get(key)
            if not isinstance(given, dict):
                raise ProtocolError(f"{name}: the init reply's {key!r} must be a map from agent id to space, got "
                                    f"{type(given).__name__}")
            for agent in agents:
                if agent not in given:
                    raise ProtocolError(f"{name}: the init reply's {key!r} has no space for agent {agent!r}")
                out[agent] = space_from_wire(given[agent], f"{name}.{key}[{agent!r}]")
        for agent in agents:
            act = self._act_spaces[agent]
            if masked:
                if not isinstance(act, spaces.Discrete):
                    raise ProtocolError(f"{name}: action_masks need Discrete action spaces; agent {agent!r} has {act}")
                self._obs_spaces[agent] = spaces.Dict({
                    "observation": self._obs_spaces[agent],
                    ACTION_MASK_KEY: spaces.Box(0, 1, (int(act.n),), np.int8)})
        self.proc.set_observation_bytes(sum(space_bytes(s) for s in self._obs_spaces.values()))

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return self._act_spaces[agent]

    # ------------------------------------------------------------------------------- checks
    def _bad(self, op: str, field: str, why: str) -> ProtocolError:
        return ProtocolError(f"{self.proc.name} ({self.proc.label}): the {op} reply's {field} {why} "
                             "(docs/connector-protocol.md section 7)")

    def _per_copy(self, reply: dict[str, Any], op: str, field: str, required: bool) -> AgentMap:
        """The map of copy 0 in ``reply[field]`` (a list of one map per copy)."""
        value = reply.get(field)
        if value is None and not required:
            return {}
        if not isinstance(value, list) or len(value) != 1:
            raise self._bad(op, repr(field), f"must be a list of 1 map (one per copy), got {value!r:.80}")
        (m,) = value
        if not isinstance(m, dict):
            raise self._bad(op, repr(field), f"must hold maps from agent id to value, got {type(m).__name__}")
        for agent in m:
            if agent not in self.possible_agents:
                raise self._bad(op, f"{field!r}", f"names agent {agent!r}, which is not one of possible_agents "
                                f"{self.possible_agents}")
        return m

    def _observations(self, reply: dict[str, Any], op: str) -> AgentMap:
        obs = self._per_copy(reply, op, "obs", True)
        masks = self._per_copy(reply, op, "action_masks", False)
        out: AgentMap = {}
        for agent, o in obs.items():
            space = self._obs_spaces[agent]
            inner = space["observation"] if self._masked else space
            why = shape_mismatch(o, inner)
            if why is not None:
                raise self._bad(op, f"'obs' for agent {agent!r}", why)
            o = conform(o, inner)
            if self._masked:
                if agent not in masks:
                    raise self._bad(op, "'action_masks'", f"has no mask for agent {agent!r}, which is observed "
                                    "(the init reply declared action_masks)")
                n = int(self._act_spaces[agent].n)
                why = shape_mismatch(masks[agent], spaces.Box(0, 1, (n,), np.int8))
                if why is not None:
                    raise self._bad(op, f"'action_masks' for agent {agent!r}", why)
                o = {"observation": o, ACTION_MASK_KEY: np.asarray(masks[agent]).astype(np.int8)}
            out[agent] = o
        return out

    def _flags(self, reply: dict[str, Any], field: str, acted: list[str]) -> dict[str, bool]:
        m = self._per_copy(reply, "step", field, True)
        for agent in acted:
            if agent not in m:
                raise self._bad("step", repr(field), f"has no entry for agent {agent!r}, which acted this step")
        for agent, v in m.items():
            if not isinstance(v, (bool, np.bool_)) and v not in (0, 1):
                raise self._bad("step", f"{field!r} for agent {agent!r}", f"is {v!r:.40}, expected a bool")
        return {a: bool(v) for a, v in m.items()}

    # ------------------------------------------------------------------------------- the env
    def _call(self, msg: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.proc.call(msg)
        except ProcessFailed as e:  # not restarted (module docstring): the run stops here, quoting the process
            self.proc.kill()
            raise ConnectorCrashed(f"{self.proc.name} ({self.proc.label}) failed during {msg['op']!r}: {e}; "
                                   f"multi-agent connectors are not restarted.{self.proc.tail_text()}") from None

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[AgentMap, AgentMap]:
        reply = self._call({"op": "reset", "seeds": [seed], "env_ids": None})
        obs = self._observations(reply, "reset")
        if not obs:
            raise self._bad("reset", "'obs'", "observes no agent; at least one must act first")
        self.agents = list(self.possible_agents)
        return obs, {a: {} for a in obs}

    def step(self, actions: AgentMap) -> tuple[AgentMap, dict[str, float], dict[str, bool], dict[str, bool], AgentMap]:
        wire = {a: int(v) if isinstance(self._act_spaces[a], spaces.Discrete) else np.asarray(v)
                for a, v in actions.items()}
        reply = self._call({"op": "step", "actions": [wire]})
        self.proc.mark_healthy_step()
        rewards_in = self._per_copy(reply, "step", "rewards", True)
        for agent in actions:
            if agent not in rewards_in:
                raise self._bad("step", "'rewards'", f"has no entry for agent {agent!r}, which acted this step")
        rewards: dict[str, float] = {}
        for agent, r in rewards_in.items():
            if isinstance(r, bool) or not isinstance(r, (int, float, np.number)) or not math.isfinite(float(r)):
                raise self._bad("step", f"'rewards' for agent {agent!r}", f"is {r!r:.40}, expected a finite number")
            rewards[agent] = float(r)
        terms = self._flags(reply, "terminated", list(actions))
        truncs = self._flags(reply, "truncated", list(actions))
        obs = self._observations(reply, "step")
        ended = {a for a in self.agents if terms.get(a) or truncs.get(a)}
        self.agents = [a for a in self.agents if a not in ended]
        if self.agents and not any(a in obs for a in self.agents):
            raise self._bad("step", "'obs'", f"observes none of the live agents {self.agents}; a step must observe "
                            "the agents that act next (or end every agent's episode)")
        return obs, rewards, terms, truncs, {a: {} for a in obs}

    def close(self) -> None:
        self.proc.close()
