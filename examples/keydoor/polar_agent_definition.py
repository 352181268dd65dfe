"""The design document's ``MySimpleAgent``, written against ``polar.AgentBase``.

Two changes from the sketch make it trainable at scale: ``act`` works on a *batch* of observations
(one forward pass for all envs of a worker), and it has a value head, returning ``logits`` and
``values`` in ``extra_info`` (attached, not detached) so PPO can train it.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from polar import AgentBase


class MySimpleAgent(AgentBase):
    def __init__(self, obs_dim: int, action_dim: int) -> None:
        super().__init__()
        self.obs_dim = obs_dim
        self.net = nn.Sequential(
            nn.Linear(obs_dim, 128),
            nn.ReLU(),
            nn.Linear(128, 64),
            nn.ReLU(),
        )
        self.policy_head = nn.Linear(64, action_dim)
        self.value_head = nn.Linear(64, 1)
        nn.init.orthogonal_(self.policy_head.weight, 0.01)
        nn.init.zeros_(self.policy_head.bias)

    def act(self, observation, internal_state=None, deterministic=False):
        """observation: {"visual": [B, 98], "inventory": [B, 2]} -> actions [B]."""
        vis_vec = torch.as_tensor(observation["visual"], dtype=torch.float32)
        inv_vec = torch.as_tensor(observation["inventory"], dtype=torch.float32)
        combined_obs = torch.cat([vis_vec, inv_vec], dim=-1)
        hidden = self.net(combined_obs)
        logits = self.policy_head(hidden)
        if deterministic:
            action = logits.argmax(dim=-1)
        else:
            action = torch.distributions.Categorical(logits=logits).sample()
        extra_info = {"logits": logits, "values": self.value_head(hidden).squeeze(-1)}
        return action, None, extra_info

    def get_initial_state(self, batch_size=1):
        return None  # a feed-forward agent has no memory
