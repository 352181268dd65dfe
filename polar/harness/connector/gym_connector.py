"""A connector that hosts any registered Gymnasium id: ``module: polar.harness.connector.gym_connector``.

Useful to run a Gymnasium env out of process (isolation from a crashy env) and as the fair
reference for ``benchmarks/connector_overhead.py``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym


class GymnasiumConnector:
    """``config: {id: CartPole-v1, kwargs: {...}}``."""

    def __init__(self, config: dict[str, Any]) -> None:
        if "id" not in config:
            raise ValueError("GymnasiumConnector needs config.id, e.g. {id: CartPole-v1}")
        self.env = gym.make(config["id"], **config.get("kwargs", {}))
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space

    def reset(self, seed: int | None = None) -> tuple[Any, dict]:
        return self.env.reset(seed=seed)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()
