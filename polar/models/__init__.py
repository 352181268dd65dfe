"""Networks: encoders (MLP, CNN, per-key Dict), heads/distributions, the built-in actor-critic, normalizers."""

from polar.models.actor_critic import ActorCriticAgent
from polar.models.loader import build_agent
from polar.models.policy import Policy, build_policy

__all__ = ["ActorCriticAgent", "Policy", "build_agent", "build_policy"]
