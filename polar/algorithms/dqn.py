"""DQN (Mnih et al. 2015), with optional Double DQN (van Hasselt et al. 2016) and prioritized replay.

The loss is the Huber loss between Q(s, a) and ``r + gamma^m * (1 - terminated) * max_a' Q_target(s', a')``
(m = 1, or the steps an n-step transition spans).
Truncated steps are not terminal: their ``next_obs`` is the episode's final observation, so they
bootstrap. Exploration is epsilon-greedy with epsilon decaying linearly over
``exploration_fraction * total_env_steps``; the learner writes it into the agent, which carries it to
the rollout workers with the weights.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from polar.algorithms.optim import Adam, module_device, polyak_update
from polar.algorithms.ppo import schedule_value
from polar.config.dqn import DQNKwargs
from polar.config.sac import SACKwargs
from polar.types import Batch, Replay


def linear_schedule(start: float, end: float, fraction: float, progress: float) -> float:
    """``start`` -> ``end`` over the first ``fraction`` of training, then ``end`` (SB3's get_linear_fn)."""
    if fraction <= 0 or progress >= fraction:
        return end
    return start + (end - start) * progress / fraction


def phase_gradient_steps(gradient_steps: int | None, train_freq: int, transitions: int) -> int:
    """Gradient steps after a fragment of ``transitions``: ``gradient_steps``, -1 = one per transition,
    None (the default) = one per ``train_freq`` transitions, so the updates per transition stay SB3's
    single-env ratio however many envs filled the fragment."""
    if gradient_steps is None:
        return max(1, transitions // train_freq)
    return transitions if gradient_steps < 0 else gradient_steps


def due_gradient_steps(kw: DQNKwargs | SACKwargs, replay_size: int, env_steps: int, transitions: int) -> int:
    """The gradient steps due after ``transitions`` new ones (DQN and SAC alike): none until ``learning_starts``
    env steps were collected and the replay holds a minibatch (a resumed run whose checkpoint had no buffer
    waits until one arrived again), then ``phase_gradient_steps``."""
    if env_steps <= kw.learning_starts or replay_size < min(kw.batch_size, max(1, kw.learning_starts)):
        return 0
    return phase_gradient_steps(kw.gradient_steps, kw.train_freq, transitions)


class DQNLearner:
    """Owns the target network and the optimizer; ``train`` runs gradient steps on replayed batches."""

    def __init__(self, agent, kwargs, total_env_steps: int) -> None:
        self.agent = agent
        self.kw = kwargs
        self.total_env_steps = max(1, int(total_env_steps))
        self.target = copy.deepcopy(agent.q_net)  # before the optimizer re-points parameters into its flat buffer
        self.target.requires_grad_(False)
        self.optimizer = Adam(agent.q_net.parameters(), lr=kwargs.learning_rate)
        self.device = module_device(agent)  # the trainer put the agent on the learner's device
        self.n_updates = 0
        self.last_target_update = 0

    def progress(self, env_steps: int) -> float:
        return min(1.0, env_steps / self.total_env_steps)

    def exploration_rate(self, env_steps: int) -> float:
        kw = self.kw
        return linear_schedule(kw.exploration_initial_eps, kw.exploration_final_eps, kw.exploration_fraction,
                               self.progress(env_steps))

    def set_exploration(self, env_steps: int) -> None:
        """Epsilon (and random actions until ``learning_starts``) for the steps collected next."""
        self.agent.epsilon.fill_(self.exploration_rate(env_steps))
        self.agent.explore_uniform.fill_(1.0 if env_steps < self.kw.learning_starts else 0.0)

    def update(self, batch: Batch[Replay]) -> dict[str, Any]:
        """One training phase after a collect: ``due_gradient_steps`` gradient steps on replayed minibatches,
        then epsilon for the steps collected next (also during the warm-up, before the first phase)."""
        replay, env_steps = batch.data.sampler, batch.run_env_steps
        steps = due_gradient_steps(self.kw, len(replay), env_steps, batch.env_steps)
        stats = self.train(replay, steps, env_steps) if steps else {}
        self.set_exploration(env_steps)
        stats["exploration_rate"] = float(self.agent.explore_uniform.clamp(min=self.agent.epsilon))
        return stats

    def train(self, replay, gradient_steps: int, env_steps: int) -> dict[str, Any]:
        kw = self.kw
        agent = self.agent
        self.optimizer.lr = schedule_value(kw.learning_rate, kw.lr_schedule, self.progress(env_steps))
        beta = kw.prioritized_replay_beta0 + (1.0 - kw.prioritized_replay_beta0) * self.progress(env_steps)
        losses, q_means, grad_norm = [], [], 0.0
        for _ in range(gradient_steps):
            batch = replay.sample(kw.batch_size, beta) if kw.prioritized_replay else replay.sample(kw.batch_size)
            batch = batch.to(self.device)
            with torch.no_grad():
                next_q_target = self.target(batch.next_obs)
                if kw.double_q:
                    next_actions = agent.q_values(batch.next_obs).argmax(-1, keepdim=True)
                    next_q = next_q_target.gather(1, next_actions).squeeze(1)
                else:
                    next_q = next_q_target.max(-1).values
                target = batch.rewards + (1.0 - batch.terminated) * kw.gamma ** batch.steps * next_q
            q = agent.q_values(batch.obs).gather(1, batch.actions.long().reshape(-1, 1)).squeeze(1)
            loss = (batch.weights * nn.functional.smooth_l1_loss(q, target, reduction="none")).mean()
            self.optimizer.zero_grad()
            loss.backward()
            grad_norm = float(self.optimizer.clip_grad_norm_(kw.max_grad_norm))
            self.optimizer.step()
            if kw.prioritized_replay:
                replay.update_priorities(batch.indices, (q - target).detach().abs().cpu().numpy())
            losses.append(float(loss.detach()))
            q_means.append(float(q.detach().mean()))
            self.n_updates += 1
        self.update_target(env_steps)
        stats: dict[str, Any] = {"exploration_rate": float(agent.epsilon), "n_updates": self.n_updates,
                                 "learning_rate": self.optimizer.lr}
        if losses:
            stats.update(loss=float(np.mean(losses)), q_mean=float(np.mean(q_means)), grad_norm=grad_norm)
        return stats

    def update_target(self, env_steps: int) -> None:
        """The target updates SB3 makes every ``target_update_interval`` env steps, made at once after a
        training phase: k due updates of coefficient tau compound to one of 1 - (1 - tau)^k."""
        due = (env_steps - self.last_target_update) // self.kw.target_update_interval
        if due <= 0:
            return
        polyak_update(self.target, self.agent.q_net, 1.0 - (1.0 - self.kw.tau) ** due)
        self.last_target_update += due * self.kw.target_update_interval

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "target": self.target.state_dict(),
                "n_updates": self.n_updates, "last_target_update": self.last_target_update}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.target.load_state_dict(state["target"])
        self.n_updates = int(state["n_updates"])
        self.last_target_update = int(state["last_target_update"])
