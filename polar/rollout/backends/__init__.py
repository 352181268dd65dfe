"""Rollout backends: ``local`` (processes on this machine) and ``ray`` (actors on a cluster)."""

from polar.rollout.backends.base import RolloutBackend, make_backend

__all__ = ["RolloutBackend", "make_backend"]
