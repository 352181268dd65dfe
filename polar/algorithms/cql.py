"""CQL (Kumar et al. 2020): conservative Q-learning from a dataset, for Discrete and Box actions.

Both add to the TD loss the CQL(H) gap ``logsumexp_a Q(s, a) - Q(s, a_data)``, which pushes Q down on actions
the dataset does not take and up on those it does; ``conservative_weight`` scales it (d3rlpy's defaults
throughout, ``d3rlpy.algos.DiscreteCQL`` and ``CQL``).

- **Discrete** (:class:`DiscreteCQLLearner`): the agent is DQN's Q-network; Double DQN's target
  ``r + gamma (1 - terminated) Q_target(s', argmax_a Q(s', a))`` under the Huber loss, plus
  ``conservative_weight * gap`` with the logsumexp exact over the actions. The agent acts greedily.
- **Box** (:class:`CQLLearner`): SAC (twin critics, squashed-Gaussian actor, learned temperature) whose
  critics' loss adds ``alpha * conservative_weight * (gap - alpha_threshold)`` per critic; the logsumexp over
  actions is estimated from ``n_action_samples`` uniform actions and as many policy actions at ``s`` and at
  ``s'`` (each value minus its log-density: importance sampling), and ``alpha`` is a Lagrange multiplier learned
  so the gap stays near ``alpha_threshold`` (``alpha_learning_rate: 0`` fixes it). The TD target is the
  deterministic backup ``min_j Q_target_j(s', tanh(mu(s')))``, no entropy term (d3rlpy's default).

The pure functions (:func:`discrete_cql_gap`, :func:`continuous_cql_gap`, :func:`double_q_target`) are the losses;
the learners only own the networks, the optimizers and the order of the updates.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from polar.algorithms.bc import OfflineBatch
from polar.algorithms.optim import Adam, polyak_update
from polar.types import Batch

DISCRETE_WEIGHT, BOX_WEIGHT = 1.0, 5.0  # d3rlpy DiscreteCQL's alpha, CQL's conservative_weight


def discrete_cql_gap(q_all: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``mean_s [logsumexp_a Q(s, a) - Q(s, a_data)]`` for ``q_all`` of shape ``[B, n_actions]`` (>= 0)."""
    q_data = q_all.gather(1, actions.long().reshape(-1, 1)).squeeze(1)
    return (torch.logsumexp(q_all, 1) - q_data).mean()


def double_q_target(rewards: torch.Tensor, terminated: torch.Tensor, q_next_online: torch.Tensor,
                    q_next_target: torch.Tensor, gamma: float) -> torch.Tensor:
    """Double DQN: the online network picks ``a' = argmax Q(s', .)``, the target network values it."""
    best = q_next_online.argmax(1, keepdim=True)
    return rewards + gamma * (1.0 - terminated) * q_next_target.gather(1, best).squeeze(1)


def continuous_cql_gap(q_data: torch.Tensor, q_sampled: torch.Tensor, log_density: torch.Tensor) -> torch.Tensor:
    """One critic's ``mean_s [logsumexp_a Q(s, a) - Q(s, a_data)]``, the logsumexp importance-sampled.

    ``q_data`` is ``[B]``; ``q_sampled`` ``[B, K]`` is Q(s, .) at K sampled actions (uniform ones and policy
    ones), ``log_density`` (broadcast to ``[B, K]``) the log-density each was drawn with. The logsumexp is over
    ``Q - log_density`` (the sum over actions of exp Q, estimated up to the constant log K)."""
    return (torch.logsumexp(q_sampled - log_density, 1) - q_data).mean()


def uniform_log_density(action_dim: int) -> float:
    """log of the uniform density on [-1, 1]^d (the critics' and the policy's squashed action scale)."""
    return action_dim * math.log(0.5)


def _step(opt: Adam, loss: torch.Tensor, max_grad_norm: float | None) -> float:
    opt.zero_grad()
    loss.backward()
    grad = opt.clip_grad_norm_(max_grad_norm if max_grad_norm is not None else float("inf"))
    opt.step()
    return float(grad)


class DiscreteCQLLearner:
    """DQN's Q-network (``agent.q_net``), its target, one optimizer: Double DQN + the CQL(H) gap."""

    def __init__(self, agent: Any, kwargs: Any) -> None:
        self.agent = agent
        self.kw = kwargs
        self.weight = DISCRETE_WEIGHT if kwargs.conservative_weight is None else kwargs.conservative_weight
        agent.epsilon.fill_(0.0)  # acts greedily, also when asked to sample (no exploration: nothing is collected)
        agent.explore_uniform.fill_(0.0)
        self.target = copy.deepcopy(agent.q_net)  # before the optimizer re-points parameters
        self.target.requires_grad_(False)
        self.optimizer = Adam(agent.q_net.parameters(), lr=kwargs.learning_rate)
        self.n_updates = 0

    def update(self, batch: Batch[list[OfflineBatch]]) -> dict[str, Any]:
        batches = batch.data
        kw = self.kw
        sums = {"td_loss": 0.0, "cql_gap": 0.0, "critic_loss": 0.0, "q_mean": 0.0}
        grad = 0.0
        for b in batches:
            q_all = self.agent.q_values(b.obs)
            q = q_all.gather(1, b.actions.long().reshape(-1, 1)).squeeze(1)
            with torch.no_grad():
                target = double_q_target(b.rewards, b.terminated, self.agent.q_values(b.next_obs),
                                         self.target(b.next_obs), kw.gamma)
            td_loss = nn.functional.smooth_l1_loss(q, target)
            gap = discrete_cql_gap(q_all, b.actions)
            loss = td_loss + self.weight * gap
            grad = _step(self.optimizer, loss, kw.max_grad_norm)
            self.n_updates += 1
            if self.n_updates % kw.target_update_interval == 0:
                polyak_update(self.target, self.agent.q_net, kw.tau)
            for k, v in (("td_loss", td_loss), ("cql_gap", gap), ("critic_loss", loss), ("q_mean", q)):
                sums[k] += float(v.detach().mean())
        n = max(1, len(batches))
        return {**{k: v / n for k, v in sums.items()}, "grad_norm": grad, "n_updates": self.n_updates}

    def state_dict(self) -> dict[str, Any]:
        return {"target": self.target.state_dict(), "optimizer": self.optimizer.state_dict(),
                "n_updates": self.n_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.n_updates = int(state["n_updates"])


class CQLLearner:
    """SAC's actor (the agent), twin ``QCritic``s and targets, the temperature and the CQL Lagrange multiplier."""

    def __init__(self, agent: Any, kwargs: Any, make_critic: Callable[[], nn.Module], action_space: gym.spaces.Box) -> None:
        """``make_critic()`` builds one Q(s, a) network (the trainer passes ``polar.models.off_policy.QCritic``
        for the run's spaces, as for SAC): the learner owns two of them and their targets."""
        self.agent = agent
        self.kw = kwargs
        self.weight = BOX_WEIGHT if kwargs.conservative_weight is None else kwargs.conservative_weight
        self.action_dim = int(np.prod(action_space.shape))
        agent.explore_uniform.fill_(0.0)  # samples its own Gaussian, never the uniform warm-up
        self.critics = nn.ModuleList([make_critic() for _ in range(2)])
        self.target = copy.deepcopy(self.critics)  # before the optimizers re-point parameters
        self.target.requires_grad_(False)
        self._critic_params = list(self.critics.parameters())
        self.actor_optimizer = Adam(agent.parameters(), lr=kwargs.actor_learning_rate)
        self.critic_optimizer = Adam(self.critics.parameters(), lr=kwargs.learning_rate)
        self.target_entropy = (-float(self.action_dim) if kwargs.target_entropy == "auto"
                               else float(kwargs.target_entropy))
        self.log_ent_coef: nn.Parameter | None = None
        self.ent_optimizer: Adam | None = None
        if kwargs.ent_coef == "auto":
            self.log_ent_coef = nn.Parameter(torch.tensor([math.log(kwargs.initial_ent_coef)]))
            self.ent_optimizer = Adam([self.log_ent_coef], lr=kwargs.temperature_learning_rate)
        self.log_alpha = nn.Parameter(torch.tensor([math.log(kwargs.initial_alpha)]))
        self.alpha_optimizer = (Adam([self.log_alpha], lr=kwargs.alpha_learning_rate)
                                if kwargs.alpha_learning_rate > 0 else None)
        self.n_updates = 0

    def _q_at(self, critic: nn.Module, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q(s, a) for ``actions`` ``[B, N, d]`` at each of the B states: ``[B, N]``."""
        batch, n = actions.shape[0], actions.shape[1]
        rep = obs.unsqueeze(1).expand(batch, n, *obs.shape[1:]).reshape(batch * n, *obs.shape[1:])
        return critic(rep, actions.reshape(batch * n, -1)).reshape(batch, n)

    def _policy_samples(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """N policy actions per state (env scale) and their log-densities, both without gradients: ``[B, N, d]``, ``[B, N]``."""
        n = self.kw.n_action_samples
        with torch.no_grad():
            rep = obs.unsqueeze(1).expand(obs.shape[0], n, *obs.shape[1:]).reshape(obs.shape[0] * n, *obs.shape[1:])
            actions, log_pi = self.agent.sample(rep)
        return actions.reshape(obs.shape[0], n, -1), log_pi.reshape(obs.shape[0], n)

    def update(self, batch: Batch[list[OfflineBatch]]) -> dict[str, Any]:
        batches = batch.data
        kw = self.kw
        agent = self.agent
        sums = {"actor_loss": 0.0, "critic_loss": 0.0, "td_loss": 0.0, "cql_gap": 0.0, "cql_alpha": 0.0,
                "ent_coef": 0.0, "entropy": 0.0, "q_mean": 0.0}
        scale = agent.action_scale.reshape(1, 1, -1)
        bias = agent.action_bias.reshape(1, 1, -1)
        for b in batches:
            batch = b.obs.shape[0]
            actions_pi, log_pi = agent.sample(b.obs)
            if self.log_ent_coef is not None and self.ent_optimizer is not None:
                ent_coef = self.log_ent_coef.detach().exp()
                ent_loss = -(self.log_ent_coef * (log_pi.detach() + self.target_entropy)).mean()
                _step(self.ent_optimizer, ent_loss, None)
            else:
                ent_coef = torch.tensor(float(kw.ent_coef))

            with torch.no_grad():
                mu, _ = agent._dist_params(b.next_obs)
                next_action = agent._to_env(torch.tanh(mu))
                next_q = torch.min(*(c(b.next_obs, next_action) for c in self.target))
                target = b.rewards + kw.gamma * (1.0 - b.terminated) * next_q
            # N uniform actions, N policy actions at s and N at s' (both valued at s): [B, 3N, d], log-densities [B, 3N]
            random_actions = (torch.rand(batch, kw.n_action_samples, self.action_dim) * 2.0 - 1.0) * scale + bias
            pi_actions, pi_log = self._policy_samples(b.obs)
            next_pi_actions, next_pi_log = self._policy_samples(b.next_obs)
            sampled = torch.cat([random_actions, pi_actions, next_pi_actions], 1)
            log_density = torch.cat([torch.full_like(pi_log, uniform_log_density(self.action_dim)), pi_log,
                                     next_pi_log], 1)
            alpha = self.log_alpha.detach().exp().clamp(0.0, 1e6)
            td_loss = torch.zeros(())
            gaps = []
            q_data = None
            for c in self.critics:
                q = c(b.obs, b.actions)
                q_data = q if q_data is None else q_data
                td_loss = td_loss + nn.functional.mse_loss(q, target)
                gaps.append(continuous_cql_gap(q, self._q_at(c, b.obs, sampled), log_density))
            gap = torch.stack(gaps)
            conservative = self.weight * (gap - kw.alpha_threshold)
            critic_loss = td_loss + (alpha * conservative).sum()
            if self.alpha_optimizer is not None:  # the multiplier rises while the gap is above the threshold
                alpha_loss = -(self.log_alpha.exp().clamp(0.0, 1e6) * conservative.detach()).mean()
                _step(self.alpha_optimizer, alpha_loss, None)
            _step(self.critic_optimizer, critic_loss, kw.max_grad_norm)

            for p in self._critic_params:  # the actor loss needs dQ/da, not the critics' weight gradients
                p.requires_grad_(False)
            q_pi = torch.min(*(c(b.obs, actions_pi) for c in self.critics))
            actor_loss = (ent_coef * log_pi - q_pi).mean()
            _step(self.actor_optimizer, actor_loss, kw.max_grad_norm)
            for p in self._critic_params:
                p.requires_grad_(True)

            self.n_updates += 1
            if self.n_updates % kw.target_update_interval == 0:
                polyak_update(self.target, self.critics, kw.tau)
            assert q_data is not None
            for k, v in (("actor_loss", actor_loss), ("critic_loss", critic_loss), ("td_loss", td_loss),
                         ("cql_gap", gap.mean()), ("cql_alpha", alpha), ("ent_coef", ent_coef),
                         ("entropy", -log_pi), ("q_mean", q_data)):
                sums[k] += float(v.detach().mean())
        n = max(1, len(batches))
        return {**{k: v / n for k, v in sums.items()}, "n_updates": self.n_updates}

    def state_dict(self) -> dict[str, Any]:
        return {"critics": self.critics.state_dict(), "target": self.target.state_dict(),
                "actor_optimizer": self.actor_optimizer.state_dict(),
                "critic_optimizer": self.critic_optimizer.state_dict(),
                "log_ent_coef": None if self.log_ent_coef is None else self.log_ent_coef.detach().clone(),
                "ent_optimizer": None if self.ent_optimizer is None else self.ent_optimizer.state_dict(),
                "log_alpha": self.log_alpha.detach().clone(),
                "alpha_optimizer": None if self.alpha_optimizer is None else self.alpha_optimizer.state_dict(),
                "n_updates": self.n_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critics.load_state_dict(state["critics"])
        self.target.load_state_dict(state["target"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        with torch.no_grad():
            if self.log_ent_coef is not None and state.get("log_ent_coef") is not None:
                self.log_ent_coef.copy_(state["log_ent_coef"])
                if self.ent_optimizer is not None:
                    self.ent_optimizer.load_state_dict(state["ent_optimizer"])
            self.log_alpha.copy_(state["log_alpha"])
        if self.alpha_optimizer is not None and state.get("alpha_optimizer") is not None:
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        self.n_updates = int(state["n_updates"])
