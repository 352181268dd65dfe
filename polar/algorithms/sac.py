"""SAC (Haarnoja et al. 2018, with the learned temperature of the follow-up paper).

Twin Q critics with Polyak-averaged targets; the actor maximizes ``min(Q1, Q2)(s, a~pi) - alpha * log pi``;
with ``ent_coef: auto`` alpha is learned so the policy's entropy tracks ``target_entropy``. The order
of the three updates in one gradient step follows SB3: temperature, critics, actor.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from polar.algorithms.dqn import due_gradient_steps
from polar.algorithms.optim import Adam, module_device, polyak_update_tensors
from polar.algorithms.ppo import schedule_value
from polar.types import Batch, Replay


class SACLearner:
    """Owns the critics, their targets, the temperature and the three optimizers."""

    def __init__(self, agent, kwargs, make_critic: Callable[[], nn.Module], action_space,
                 total_env_steps: int) -> None:
        """``make_critic()`` builds one Q(s, a) network (the trainer passes ``polar.models.off_policy.QCritic``
        for the run's spaces and network settings): the learner owns two of them and their targets."""
        self.agent = agent
        self.kw = kwargs
        self.total_env_steps = max(1, int(total_env_steps))
        self.device = module_device(agent)  # the trainer put the agent on the learner's device
        self.critics = nn.ModuleList([make_critic() for _ in range(2)]).to(self.device)
        self.critic_target = copy.deepcopy(self.critics)  # before the optimizers re-point parameters
        self.critic_target.requires_grad_(False)
        self._critic_params = list(self.critics.parameters())
        self._target_pairs = (list(self.critic_target.parameters()) + list(self.critic_target.buffers()),
                              list(self.critics.parameters()) + list(self.critics.buffers()))
        self.actor_optimizer = Adam(agent.parameters(), lr=kwargs.learning_rate)
        self.critic_optimizer = Adam(self.critics.parameters(), lr=kwargs.learning_rate)
        action_dim = int(np.prod(action_space.shape))
        self.target_entropy = -float(action_dim) if kwargs.target_entropy == "auto" else float(kwargs.target_entropy)
        self.log_ent_coef: torch.Tensor | None = None
        self.ent_coef_optimizer: Adam | None = None
        if isinstance(kwargs.ent_coef, str):
            init = float(kwargs.ent_coef.split("_", 1)[1]) if "_" in kwargs.ent_coef else 1.0
            self.log_ent_coef = nn.Parameter(torch.tensor([math.log(init)], device=self.device))
            self.ent_coef_optimizer = Adam([self.log_ent_coef], lr=kwargs.learning_rate)
        self.n_updates = 0

    def progress(self, env_steps: int) -> float:
        return min(1.0, env_steps / self.total_env_steps)

    def set_exploration(self, env_steps: int) -> None:
        """Uniform-random actions until ``learning_starts``, then samples from the policy."""
        self.agent.explore_uniform.fill_(1.0 if env_steps < self.kw.learning_starts else 0.0)

    def _step(self, optimizer: Adam, loss: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss.backward()
        if self.kw.max_grad_norm is not None:
            optimizer.clip_grad_norm_(self.kw.max_grad_norm)
        optimizer.step()

    def update(self, batch: Batch[Replay]) -> dict[str, Any]:
        """One training phase after a collect (``polar.algorithms.dqn.due_gradient_steps``), then the exploration
        for the steps collected next."""
        replay, env_steps = batch.data.sampler, batch.run_env_steps
        steps = due_gradient_steps(self.kw, len(replay), env_steps, batch.env_steps)
        stats = self.train(replay, steps, env_steps) if steps else {}
        self.set_exploration(env_steps)
        return stats

    def train(self, replay, gradient_steps: int, env_steps: int) -> dict[str, Any]:
        kw = self.kw
        agent = self.agent
        lr = schedule_value(kw.learning_rate, kw.lr_schedule, self.progress(env_steps))
        for opt in (self.actor_optimizer, self.critic_optimizer, self.ent_coef_optimizer):
            if opt is not None:
                opt.lr = lr
        sums: dict[str, float] = {"actor_loss": 0.0, "critic_loss": 0.0, "ent_coef": 0.0, "entropy": 0.0, "q_mean": 0.0}
        for _ in range(gradient_steps):
            batch = replay.sample(kw.batch_size).to(self.device)
            actions_pi, log_pi = agent.sample(batch.obs)
            if self.log_ent_coef is not None and self.ent_coef_optimizer is not None:
                ent_coef = self.log_ent_coef.detach().exp()
                ent_loss = -(self.log_ent_coef * (log_pi + self.target_entropy).detach()).mean()
                self._step(self.ent_coef_optimizer, ent_loss)
            else:
                ent_coef = torch.tensor(float(kw.ent_coef), device=self.device)

            with torch.no_grad():
                next_actions, next_log_pi = agent.sample(batch.next_obs)
                next_q = torch.min(*(c(batch.next_obs, next_actions) for c in self.critic_target))
                next_q = next_q - ent_coef * next_log_pi
                target_q = batch.rewards + (1.0 - batch.terminated) * kw.gamma ** batch.steps * next_q
            q1, q2 = (c(batch.obs, batch.actions) for c in self.critics)
            critic_loss = 0.5 * (nn.functional.mse_loss(q1, target_q) + nn.functional.mse_loss(q2, target_q))
            self._step(self.critic_optimizer, critic_loss)

            for p in self._critic_params:  # the actor loss needs dQ/da, not the critics' weight gradients
                p.requires_grad_(False)
            q_pi = torch.min(*(c(batch.obs, actions_pi) for c in self.critics))
            actor_loss = (ent_coef * log_pi - q_pi).mean()
            self._step(self.actor_optimizer, actor_loss)
            for p in self._critic_params:
                p.requires_grad_(True)

            self.n_updates += 1
            if self.n_updates % kw.target_update_interval == 0:
                polyak_update_tensors(*self._target_pairs, kw.tau)
            sums["actor_loss"] += float(actor_loss.detach())
            sums["critic_loss"] += float(critic_loss.detach())
            sums["ent_coef"] += float(ent_coef)
            sums["entropy"] += float(-log_pi.detach().mean())
            sums["q_mean"] += float(q1.detach().mean())
        stats: dict[str, Any] = {"n_updates": self.n_updates, "learning_rate": lr}
        if gradient_steps > 0:
            stats.update({k: v / gradient_steps for k, v in sums.items()})
        return stats

    def state_dict(self) -> dict[str, Any]:
        return {
            "critics": self.critics.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "log_ent_coef": None if self.log_ent_coef is None else self.log_ent_coef.detach().clone(),
            "ent_coef_optimizer": None if self.ent_coef_optimizer is None else self.ent_coef_optimizer.state_dict(),
            "n_updates": self.n_updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critics.load_state_dict(state["critics"])
        self.critic_target.load_state_dict(state["critic_target"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        if self.log_ent_coef is not None and self.ent_coef_optimizer is not None and state.get("log_ent_coef") is not None:
            with torch.no_grad():
                self.log_ent_coef.copy_(state["log_ent_coef"])
            self.ent_coef_optimizer.load_state_dict(state["ent_coef_optimizer"])
        self.n_updates = int(state["n_updates"])
