"""``Policy``: an agent plus its observation normalizer: the unit whose state is published to workers."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
from torch import nn

from polar.agents import AgentBase
from polar.models.loader import build_agent
from polar.models.normalization import ObsNormalizer


class Policy(nn.Module):
    def __init__(self, agent: AgentBase, obs_norm: ObsNormalizer | None = None) -> None:
        super().__init__()
        self.agent = agent
        self.obs_norm = obs_norm

    def normalize(self, obs):
        return self.obs_norm(obs) if self.obs_norm is not None else obs

    def act(self, obs, state=None, deterministic: bool = False):
        return self.agent.act(self.normalize(obs), state, deterministic)


def build_policy(cfg, observation_space: gym.Space, action_space: gym.Space, config_dir: Path | None = None) -> Policy:
    """The policy a RunConfig describes (agent + optional obs normalizer: PPO/APPO's running statistics, or an
    offline run's dataset statistics, which ``polar.rollout.dataset`` sets)."""
    kw = getattr(cfg.policy, "kwargs", None)
    norm = ObsNormalizer(observation_space, kw.clip_obs) if kw is not None and getattr(kw, "normalize_obs", False) else None
    if getattr(kw, "network", None) == "off_policy":  # DQN's / SAC's networks (CQL trains them offline)
        from polar.models.off_policy import build_off_policy_agent

        return Policy(build_off_policy_agent(cfg, observation_space, action_space), norm)
    agent = build_agent(cfg.agent, observation_space, action_space, config_dir)
    return Policy(agent, norm)
