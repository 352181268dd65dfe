"""IQL (Kostrikov et al. 2021): implicit Q-learning, for discrete and continuous actions.

V is an expectile regression of the target critics' ``min(Q1, Q2)(s, a)`` over the dataset's actions only (so no
out-of-distribution action is ever queried); the critics regress to ``r + gamma * (1 - terminated) * V(s')``;
the classic agent is then extracted by advantage-weighted regression: the dataset's log-likelihood weighted by
``min(exp(beta * (Q - V)), max_weight)``. ``beta = 0`` is behaviour cloning.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from polar.algorithms.bc import BCLearner, OfflineBatch, bc_loss
from polar.algorithms.optim import Adam, polyak_update
from polar.types import Batch


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """Asymmetric L2 of ``diff = Q - V``: weight ``expectile`` where V is below Q, ``1 - expectile`` above."""
    weight = torch.where(diff > 0, expectile, 1.0 - expectile)
    return (weight * diff.pow(2)).mean()


def awr_weights(advantage: torch.Tensor, temperature: float, max_weight: float) -> torch.Tensor:
    return torch.exp(temperature * advantage).clamp(max=max_weight)


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Critic(nn.Module):
    """Q(s, a): discrete actions -> one output per action, gathered; continuous -> (s, a) in, one value out."""

    def __init__(self, obs_dim: int, action_space: gym.Space, hidden: list[int]) -> None:
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        out, extra = (int(action_space.n), 0) if self.discrete else (1, int(np.prod(action_space.shape)))
        self.start = int(action_space.start) if self.discrete else 0
        self.net = mlp([obs_dim + extra, *hidden, out])

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        flat = obs.reshape(obs.shape[0], -1)
        if self.discrete:
            idx = (actions.long().reshape(-1) - self.start).unsqueeze(1)
            return self.net(flat).gather(1, idx).squeeze(1)
        return self.net(torch.cat([flat, actions.reshape(actions.shape[0], -1).float()], 1)).squeeze(1)


class IQLLearner(BCLearner):
    """Twin critics with Polyak targets, V, and the agent's optimizer (BC's, weighted)."""

    def __init__(self, agent: Any, kwargs: Any, observation_space: gym.Space, action_space: gym.Space) -> None:
        super().__init__(agent, kwargs)
        obs_dim = int(np.prod(observation_space.shape))
        self.critics = nn.ModuleList([Critic(obs_dim, action_space, kwargs.critic_hidden) for _ in range(2)])
        self.target = copy.deepcopy(self.critics)  # before the optimizer re-points parameters
        self.target.requires_grad_(False)
        self.value = mlp([obs_dim, *kwargs.critic_hidden, 1])
        self.critic_optimizer = Adam(self.critics.parameters(), lr=kwargs.learning_rate)
        self.value_optimizer = Adam(self.value.parameters(), lr=kwargs.learning_rate)

    def v(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value(obs.reshape(obs.shape[0], -1)).squeeze(1)

    def _step(self, opt: Adam, loss: torch.Tensor) -> None:
        opt.zero_grad()
        loss.backward()
        if self.kw.max_grad_norm is not None:
            opt.clip_grad_norm_(self.kw.max_grad_norm)
        opt.step()

    def update(self, batch: Batch[list[OfflineBatch]]) -> dict[str, Any]:
        batches = batch.data
        kw = self.kw
        sums = {"value_loss": 0.0, "critic_loss": 0.0, "actor_loss": 0.0, "q_mean": 0.0, "adv_weight_mean": 0.0}
        grad = 0.0
        for b in batches:
            with torch.no_grad():
                q_t = torch.min(self.target[0](b.obs, b.actions), self.target[1](b.obs, b.actions))
            v = self.v(b.obs)
            value_loss = expectile_loss(q_t - v, kw.expectile)
            self._step(self.value_optimizer, value_loss)
            with torch.no_grad():
                target = b.rewards + kw.gamma * (1.0 - b.terminated) * self.v(b.next_obs)
            critic_loss = sum(nn.functional.mse_loss(c(b.obs, b.actions), target) for c in self.critics)
            self._step(self.critic_optimizer, critic_loss)  # type: ignore[arg-type]
            with torch.no_grad():
                weights = awr_weights(q_t - v.detach(), kw.temperature, kw.max_weight)
            log_prob, _, _ = self.agent.evaluate_actions(b.obs, b.actions)
            actor_loss = bc_loss(log_prob, weights)
            grad = self._actor_step(actor_loss)
            polyak_update(self.target, self.critics, kw.tau)
            self.n_updates += 1
            for k, val in (("value_loss", value_loss), ("critic_loss", critic_loss), ("actor_loss", actor_loss),
                           ("q_mean", q_t.mean()), ("adv_weight_mean", weights.mean())):
                sums[k] += float(val.detach()) if isinstance(val, torch.Tensor) else float(val)
        n = max(1, len(batches))
        return {**{k: v / n for k, v in sums.items()}, "grad_norm": grad, "n_updates": self.n_updates}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "critics": self.critics.state_dict(), "target": self.target.state_dict(),
                "value": self.value.state_dict(), "critic_optimizer": self.critic_optimizer.state_dict(),
                "value_optimizer": self.value_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.critics.load_state_dict(state["critics"])
        self.target.load_state_dict(state["target"])
        self.value.load_state_dict(state["value"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.value_optimizer.load_state_dict(state["value_optimizer"])
