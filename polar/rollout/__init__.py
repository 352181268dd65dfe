"""Rollouts: env runners, worker processes and the backends that place them.

The names below are imported on first use (PEP 562): importing a light submodule (the agent run's config
checks read ``polar.rollout.sessions``) must not pay for torch."""

from typing import Any

__all__ = ["EnvRunner", "Fragment", "RolloutBackend", "make_backend"]

_WHERE = {"RolloutBackend": "polar.rollout.backends.base", "make_backend": "polar.rollout.backends.base",
          "EnvRunner": "polar.rollout.runner", "Fragment": "polar.types"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'polar.rollout' has no attribute {name!r}")
