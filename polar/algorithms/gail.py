"""Adversarial imitation: GAIL and AIRL, a discriminator trained beside polar's PPO learner.

Each rollout, the discriminator takes ``disc_updates`` Adam steps on the logistic loss of telling the expert's
transitions (label 1) from the rollout's (label 0); then the rollout's rewards are replaced by the
discriminator's and :class:`~polar.algorithms.ppo.PPOLearner` runs its epochs on them, unchanged.

- GAIL (Ho & Ermon, 2016): ``D(s, a) = sigmoid(logit(s, a))``, reward ``-log(1 - D) = softplus(logit)``.
- AIRL (Fu et al., 2018): ``f(s, a, s') = g(s) + gamma * h(s') - h(s)`` (``h(s') = 0`` past a terminal step),
  ``D = sigmoid(f - log pi(a|s))``; the reward is ``f``, the shaped learned reward (PPO's entropy bonus supplies
  AIRL's entropy term).

The discriminator standardises observations by the expert dataset's mean/std (frozen, kept in its
``state_dict``) and scales Box actions to [-1, 1] by the action bounds, so it compares the two on the same footing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from polar.algorithms.optim import module_device
from polar.algorithms.ppo import PPOLearner
from polar.config.gail import GAILKwargs
from polar.errors import ConfigError
from polar.types import Batch, Metrics, Rollout

OBS_CLIP = 10.0  # standardised observations are clipped to +-this: far-off policy states do not blow up the logits
STD_FLOOR = 1e-2  # an observation dimension the expert holds constant still standardises to finite numbers


@dataclass(frozen=True)
class Transitions:
    """Flat transitions the discriminator reads: ``obs`` ``[n, obs_dim]``, ``actions`` ``[n]`` (Discrete) or
    ``[n, act_dim]``, ``next_obs`` (the final observation where an episode ended), ``terminated`` ``[n]``;
    ``log_pi``: log pi(a|s) under the current policy (AIRL), else None."""

    obs: torch.Tensor
    actions: torch.Tensor
    next_obs: torch.Tensor | None
    terminated: torch.Tensor
    log_pi: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.obs.shape[0])

    def index(self, idx: torch.Tensor) -> Transitions:
        return Transitions(self.obs[idx], self.actions[idx], None if self.next_obs is None else self.next_obs[idx],
                           self.terminated[idx], None if self.log_pi is None else self.log_pi[idx])


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def check_spaces(observation_space: gym.Space[Any], action_space: gym.Space[Any], where: str) -> None:
    """The discriminator reads flat Box observations and Discrete or Box actions."""
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        raise ConfigError(f"{where}: the discriminator reads flat Box observations; the env's are {observation_space}")
    if not isinstance(action_space, gym.spaces.Discrete | gym.spaces.Box):
        raise ConfigError(f"{where}: the discriminator reads Discrete or Box actions; the env's are {action_space}")


class Discriminator(nn.Module):
    """The common part: observation standardisation and action features. Subclasses define ``logits`` (expert
    high) and ``reward`` (what PPO maximises)."""

    needs_log_pi = False

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.Space[Any], expert_obs: torch.Tensor) -> None:
        super().__init__()
        self.obs_dim = int(observation_space.shape[0])
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        low: np.ndarray
        high: np.ndarray
        if isinstance(action_space, gym.spaces.Discrete):
            self.act_dim = int(action_space.n)
            low = high = np.zeros(0, np.float32)
        else:
            assert isinstance(action_space, gym.spaces.Box)
            self.act_dim = int(np.prod(action_space.shape))
            low = np.where(np.isfinite(action_space.low), action_space.low, -1.0).reshape(-1)
            high = np.where(np.isfinite(action_space.high), action_space.high, 1.0).reshape(-1)
        self.register_buffer("act_low", torch.as_tensor(low, dtype=torch.float32))
        self.register_buffer("act_high", torch.as_tensor(high, dtype=torch.float32))
        expert_obs = expert_obs.float()
        self.register_buffer("obs_mean", expert_obs.mean(0))
        self.register_buffer("obs_std", expert_obs.std(0, unbiased=False).clamp_min(STD_FLOOR)
                             if expert_obs.shape[0] > 1 else torch.ones(self.obs_dim))

    def obs_features(self, obs: torch.Tensor) -> torch.Tensor:
        return ((obs.float() - self.obs_mean) / self.obs_std).clamp(-OBS_CLIP, OBS_CLIP)

    def act_features(self, actions: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return F.one_hot(actions.long().reshape(-1), self.act_dim).float()
        a = actions.float().reshape(actions.shape[0], -1)
        a = torch.minimum(torch.maximum(a, self.act_low), self.act_high)  # the env clips them too
        return 2 * (a - self.act_low) / (self.act_high - self.act_low).clamp_min(1e-8) - 1

    def logits(self, t: Transitions) -> torch.Tensor:
        raise NotImplementedError

    def reward(self, t: Transitions) -> torch.Tensor:
        raise NotImplementedError


class GAILDiscriminator(Discriminator):
    """``logit(s, a)`` from one MLP; reward ``-log(1 - D(s, a)) = softplus(logit)`` (positive: GAIL's reward)."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.Space[Any], expert_obs: torch.Tensor,
                 hidden: list[int], gamma: float = 0.99) -> None:
        super().__init__(observation_space, action_space, expert_obs)
        self.net = _mlp([self.obs_dim + self.act_dim, *hidden, 1])

    def logits(self, t: Transitions) -> torch.Tensor:
        return self.net(torch.cat([self.obs_features(t.obs), self.act_features(t.actions)], -1)).squeeze(-1)

    def reward(self, t: Transitions) -> torch.Tensor:
        return F.softplus(self.logits(t))


class AIRLDiscriminator(Discriminator):
    """``f(s, a, s') = g(s) + gamma * (1 - terminated) * h(s') - h(s)``, ``logit = f - log pi(a|s)``; reward ``f``."""

    needs_log_pi = True

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.Space[Any], expert_obs: torch.Tensor,
                 hidden: list[int], gamma: float = 0.99) -> None:
        super().__init__(observation_space, action_space, expert_obs)
        self.gamma = gamma
        self.g = _mlp([self.obs_dim, *hidden, 1])
        self.h = _mlp([self.obs_dim, *hidden, 1])

    def f(self, t: Transitions) -> torch.Tensor:
        assert t.next_obs is not None  # AIRL's rollouts keep next_obs (AIRLKwargs.keeps_next_obs)
        g = self.g(self.obs_features(t.obs)).squeeze(-1)
        h = self.h(self.obs_features(t.obs)).squeeze(-1)
        h_next = self.h(self.obs_features(t.next_obs)).squeeze(-1)
        return g + self.gamma * (1 - t.terminated.float()) * h_next - h

    def logits(self, t: Transitions) -> torch.Tensor:
        assert t.log_pi is not None  # the learner fills it (needs_log_pi)
        return self.f(t) - t.log_pi

    def reward(self, t: Transitions) -> torch.Tensor:
        return self.f(t)


def discriminator_loss(expert_logits: torch.Tensor, policy_logits: torch.Tensor) -> torch.Tensor:
    """Logistic loss, expert labelled 1 and the policy 0, each side weighted equally."""
    return 0.5 * (F.binary_cross_entropy_with_logits(expert_logits, torch.ones_like(expert_logits))
                  + F.binary_cross_entropy_with_logits(policy_logits, torch.zeros_like(policy_logits)))


def rollout_transitions(rollout: Rollout) -> Transitions:
    """A rollout's transitions, flattened time-major like its buffer's ``rewards`` (``[T, N]`` -> ``[T * N]``);
    ``log_pi`` is the acting policy's, which is the current one until PPO's epochs run."""
    buf = rollout.buffer
    obs = buf.obs.reshape(-1, *buf.obs.shape[2:])
    actions = buf.actions.reshape(-1, *buf.actions.shape[2:])
    next_obs = None
    if all(f.next_obs is not None for f in rollout.fragments):
        frags = [np.asarray(f.next_obs) for f in rollout.fragments]
        nxt = torch.from_numpy(frags[0] if len(frags) == 1 else np.concatenate(frags, 1))
        next_obs = nxt.reshape(-1, *nxt.shape[2:])
    return Transitions(obs, actions, next_obs, buf.terminated.reshape(-1), buf.log_probs.reshape(-1))


class GAILLearner:
    """The discriminator's steps, its reward written into the rollout, then ``ppo.update`` on it."""

    def __init__(self, ppo: PPOLearner, discriminator: Discriminator, expert: Transitions, kwargs: GAILKwargs,
                 seed: int = 0) -> None:
        self.ppo = ppo
        self.agent = ppo.agent
        self.kw = kwargs
        self.device = module_device(ppo.agent)
        self.discriminator = discriminator.to(self.device)
        self.expert = expert
        self.optimizer = torch.optim.Adam(self.discriminator.parameters(), lr=kwargs.disc_learning_rate)
        self.generator = torch.Generator().manual_seed(seed)
        self.disc_steps = 0

    def _sample(self, t: Transitions, n: int) -> Transitions:
        idx = torch.randint(0, len(t), (n,), generator=self.generator)
        return t.index(idx)

    def _with_log_pi(self, t: Transitions) -> Transitions:
        if not self.discriminator.needs_log_pi:
            return t
        with torch.no_grad():
            log_pi, _, _ = self.agent.evaluate_actions(t.obs.to(self.device), t.actions.to(self.device))
        return replace(t, log_pi=log_pi.reshape(-1).cpu())

    def _to(self, t: Transitions) -> Transitions:
        d = self.device
        return Transitions(t.obs.to(d), t.actions.to(d), None if t.next_obs is None else t.next_obs.to(d),
                           t.terminated.to(d), None if t.log_pi is None else t.log_pi.to(d))

    def train_discriminator(self, policy: Transitions) -> Metrics:
        """``disc_updates`` Adam steps on minibatches of ``disc_batch_size`` expert and policy transitions."""
        losses, expert_acc, policy_acc = [], [], []
        n = self.kw.disc_batch_size
        for _ in range(self.kw.disc_updates):
            e = self._to(self._with_log_pi(self._sample(self.expert, n)))
            p = self._to(self._sample(policy, n))
            e_logits, p_logits = self.discriminator.logits(e), self.discriminator.logits(p)
            loss = discriminator_loss(e_logits, p_logits)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.disc_steps += 1
            losses.append(float(loss.detach()))
            expert_acc.append(float((e_logits > 0).float().mean()))
            policy_acc.append(float((p_logits < 0).float().mean()))
        return {"disc_loss": float(np.mean(losses)), "disc_expert_accuracy": float(np.mean(expert_acc)),
                "disc_policy_accuracy": float(np.mean(policy_acc)), "disc_steps": self.disc_steps}

    def update(self, batch: Batch[Rollout], /) -> Metrics:
        buf = batch.data.buffer
        policy = rollout_transitions(batch.data)
        stats = self.train_discriminator(policy)
        with torch.no_grad():
            reward = self.discriminator.reward(self._to(policy)).cpu()
        env_reward_mean = float(buf.rewards.mean())
        buf.rewards = reward.reshape(buf.rewards.shape).to(buf.rewards.dtype)
        out = self.ppo.update(batch)
        out.update(stats, disc_reward_mean=float(reward.mean()), env_reward_step_mean=env_reward_mean)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.ppo.state_dict(), "discriminator": self.discriminator.state_dict(),
                "disc_optimizer": self.optimizer.state_dict(), "disc_steps": self.disc_steps,
                "rng": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ppo.load_state_dict(state["generator"])
        self.discriminator.load_state_dict(state["discriminator"])
        self.optimizer.load_state_dict(state["disc_optimizer"])
        self.disc_steps = int(state["disc_steps"])
        self.generator.set_state(state["rng"])


__all__ = ["AIRLDiscriminator", "Discriminator", "GAILDiscriminator", "GAILLearner", "Transitions", "check_spaces",
           "discriminator_loss", "rollout_transitions"]
