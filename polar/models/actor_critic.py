"""The built-in actor-critic agents (``agent: {type: mlp | cnn | lstm}``)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from polar.agents import AgentBase, reset_state
from polar.config.agent import BuiltinAgentConfig
from polar.models.distributions import GaussianDist, action_param_size, dist_for_space
from polar.models.encoders import build_encoder


def _ortho_init(module: nn.Module, gain: float) -> None:
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(m.weight, gain)
            nn.init.zeros_(m.bias)


class ActorCriticAgent(AgentBase):
    """Encoders per observation key -> (optional LSTM) -> policy head + value head.

    Actor and critic have separate encoders unless ``share_encoder`` (SB3's default layout); the
    LSTM agent always shares one encoder and one LSTM core.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, cfg: BuiltinAgentConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or BuiltinAgentConfig()
        self.cfg = cfg
        self.bind_spaces(observation_space, action_space)
        self.recurrent = cfg.type == "lstm"
        shared = cfg.share_encoder or self.recurrent
        args = (cfg.hidden_sizes, cfg.activation, cfg.cnn_channels)
        self.pi_encoder, feat = build_encoder(observation_space, *args)
        self.vf_encoder = None if shared else build_encoder(observation_space, *args)[0]
        if self.recurrent:
            self.lstm = nn.LSTM(feat, cfg.lstm_hidden_size)
            feat = cfg.lstm_hidden_size
        self.pi_head = nn.Linear(feat, action_param_size(action_space))
        self.vf_head = nn.Linear(feat, 1)
        self.gaussian = isinstance(self.action_dist, GaussianDist)
        if self.gaussian:
            self.log_std = nn.Parameter(torch.full((action_param_size(action_space),), float(cfg.log_std_init)))
        if cfg.ortho_init:
            _ortho_init(self.pi_encoder, np.sqrt(2))
            if self.vf_encoder is not None:
                _ortho_init(self.vf_encoder, np.sqrt(2))
            _ortho_init(self.pi_head, 0.01)
            _ortho_init(self.vf_head, 1.0)
        self._dist = dist_for_space(action_space)

    def get_initial_state(self, batch_size: int = 1):
        if not self.recurrent:
            return None
        h = torch.zeros(batch_size, self.cfg.lstm_hidden_size)
        return (h, h.clone())

    def _params(self, pi_feat: torch.Tensor) -> dict:
        out = self.pi_head(pi_feat)
        if self.gaussian:
            return {"mean": out, "log_std": self.log_std}
        return {"logits": out}

    def _forward(self, obs, state):
        """Features for actor and critic at one step, plus the next state."""
        feat = self.pi_encoder(obs)
        if self.recurrent:
            h, c = state
            y, (h, c) = self.lstm(feat.unsqueeze(0), (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous()))
            feat = y.squeeze(0)
            return feat, feat, (h.squeeze(0), c.squeeze(0))
        vf_feat = feat if self.vf_encoder is None else self.vf_encoder(obs)
        return feat, vf_feat, None

    def act(self, observation, internal_state=None, deterministic: bool = False):
        pi_feat, vf_feat, state = self._forward(observation, internal_state)
        info = self._params(pi_feat)
        action = self._dist.sample(info, deterministic)
        info["log_prob"] = self._dist.log_prob(info, action)
        info["values"] = self.vf_head(vf_feat).squeeze(-1)
        return action, state, info

    def evaluate_actions(self, observation, actions, internal_state=None, episode_starts=None):
        if not self.recurrent:
            pi_feat, vf_feat, _ = self._forward(observation, None)
            info = self._params(pi_feat)
            return self._dist.log_prob(info, actions), self._dist.entropy(info), self.vf_head(vf_feat).squeeze(-1)
        steps, batch = actions.shape[0], actions.shape[1]
        flat_obs = {k: v.reshape(steps * batch, *v.shape[2:]) for k, v in observation.items()} if isinstance(observation, dict) else observation.reshape(steps * batch, *observation.shape[2:])
        feats = self.pi_encoder(flat_obs).reshape(steps, batch, -1)
        h, c = internal_state
        initial = self.get_initial_state(batch)
        outs = []
        for t in range(steps):
            h, c = reset_state((h, c), initial, episode_starts[t])
            y, (h1, c1) = self.lstm(feats[t].unsqueeze(0), (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous()))
            h, c = h1.squeeze(0), c1.squeeze(0)
            outs.append(y.squeeze(0))
        feat = torch.stack(outs)
        info = self._params(feat)
        return self._dist.log_prob(info, actions), self._dist.entropy(info), self.vf_head(feat).squeeze(-1)
