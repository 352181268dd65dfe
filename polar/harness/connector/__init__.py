"""Connectors: environments in their own process, spoken to over a small msgpack protocol.

A connector is one class, nothing else::

    class MyGameConnector:
        action_space = gymnasium.spaces.Discrete(4)     # required
        observation_space = ...                         # optional: inferred from the first obs

        def __init__(self, config: dict): ...           # a ConnectorConfig: config["seed"] is this copy's own
        def reset(self, seed=None) -> obs                # or (obs, info); ``seed`` is optional
        def step(self, action) -> (obs, reward, done, info)   # or the Gymnasium 5-tuple
        def close(self): ...

Subclassing :class:`Connector` is optional; it only documents the shape. polar hosts the class in a
separate process (``polar.harness.connector.server``) and talks to it through
:class:`ConnectorVectorEnv`; see ``docs/connector-protocol.md`` for the wire format.
"""

from __future__ import annotations

from typing import Any

from gymnasium import spaces


class ConnectorConfig(dict):
    """The ``config`` one copy of a connector is built with, like RLlib's ``EnvContext``.

    It is ``connector_spec.config`` as a plain dict, except that an integer ``seed`` key holds this
    copy's own seed (derived from that seed, the run's seed, the indices below and ``restarts``; see
    docs/connector-protocol.md), so copies do not play identical games and a restarted copy does not
    replay the game that crashed. Where the copy runs is in attributes, not keys, so code that passes
    the dict on (``Game(**config)``) sees only the user's keys:

    - ``worker_index``: the rollout worker hosting the copy (0: envs stepped by the learner itself,
      evaluation and ``polar check``; 1..N: rollout workers);
    - ``vector_index``: the copy's index among that worker's envs (0..envs_per_worker-1);
    - ``restarts``: how many times the copy's process was restarted before this copy was built.
    """

    def __init__(self, config: dict[str, Any] | None = None, worker_index: int = 0, vector_index: int = 0,
                 restarts: int = 0) -> None:
        super().__init__(config or {})
        self.worker_index = worker_index
        self.vector_index = vector_index
        self.restarts = restarts

    def __repr__(self) -> str:
        return (f"ConnectorConfig({dict.__repr__(self)}, worker_index={self.worker_index}, "
                f"vector_index={self.vector_index}, restarts={self.restarts})")


class Connector:
    """Optional base class for a Python connector: the four methods polar calls."""

    observation_space: spaces.Space | None = None
    action_space: spaces.Space | None = None

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def reset(self, seed: int | None = None) -> Any:
        raise NotImplementedError

    def step(self, action: Any) -> tuple[Any, float, bool, dict]:
        raise NotImplementedError

    def close(self) -> None:
        """Release the game's resources; called once when polar shuts the process down."""


def __getattr__(name: str) -> Any:  # keep ``import polar.harness.connector`` light for the server process
    if name in ("ConnectorVectorEnv", "ConnectorEnv"):
        from polar.harness.connector import vector_env

        return getattr(vector_env, name)
    raise AttributeError(name)
