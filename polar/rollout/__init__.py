"""Rollouts: env runners, worker processes and the backends that place them."""

from polar.rollout.backends.base import RolloutBackend, make_backend
from polar.rollout.runner import EnvRunner
from polar.types import Fragment

__all__ = ["EnvRunner", "Fragment", "RolloutBackend", "make_backend"]
