"""polar: reinforcement learning for agents on any harness, at scale.

The curated public API. Heavy submodules load lazily so ``import polar`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "AgentBase": "polar.agents",
    "Connector": "polar.harness.connector",
    "make_env": "polar.harness",
    "make_vector_env": "polar.harness",
    "load_config": "polar.config",
    "RunConfig": "polar.config",
    "EnvRunConfig": "polar.config",
    "AgentRunConfig": "polar.config",
    "PolarError": "polar.errors",
    "ConfigError": "polar.errors",
}

__all__ = [*sorted(_LAZY), "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'polar' has no attribute {name!r}")
