"""Connectors: environments in their own process, spoken to over a small msgpack protocol.

A connector is one class, nothing else::

    class MyGameConnector:
        action_space = gymnasium.spaces.Discrete(4)     # required
        observation_space = ...                         # optional: inferred from the first obs

        def __init__(self, config: dict): ...
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
