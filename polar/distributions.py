"""Action distributions as pure functions over the tensors an agent puts in ``extra_info``.

One ``ActionDist`` per action-space kind. Each reads its parameters from a dict (``logits`` for
Discrete/MultiDiscrete, ``mean`` + ``log_std`` for Box), so built-in and user agents share the same
sampling, log-prob and entropy code, and PPO never needs to know which agent produced a batch.
No ``torch.distributions`` objects: they validate arguments on every call, which dominates the cost
of a small policy on CPU.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch

from polar.errors import AgentError

_LOG_2PI = math.log(2 * math.pi)


def gumbel_argmax(logits: torch.Tensor) -> torch.Tensor:
    """One categorical sample per row (Gumbel-max trick), shape [..., 1]; several times cheaper than
    ``torch.multinomial`` for small batches on CPU."""
    return (logits - torch.empty_like(logits).exponential_().log()).argmax(-1, keepdim=True)


def categorical_sample(logits: torch.Tensor, deterministic: bool) -> torch.Tensor:
    if deterministic:
        return logits.argmax(-1)
    return gumbel_argmax(logits).squeeze(-1)


def categorical_log_prob(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, -1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits, -1)
    return -(logp.exp() * logp).sum(-1)


def gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    z = (actions - mean) * torch.exp(-log_std)
    return (-0.5 * z.pow(2) - log_std - 0.5 * _LOG_2PI).sum(-1)


def gaussian_entropy(mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    return (0.5 + 0.5 * _LOG_2PI + log_std).expand_as(mean).sum(-1)


ACTION_MASK_KEY = "action_mask"


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``logits`` with the actions ``mask`` forbids set to -inf (Gymnasium's ``action_mask``: 1 = legal), so
    sampling, argmax and log-probs only ever see the legal actions."""
    return logits.masked_fill(mask == 0, float("-inf"))


def masked_categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of a categorical whose forbidden actions have -inf logits (their 0 * -inf terms count as 0)."""
    logp = torch.log_softmax(logits, -1)
    finite_logp = torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))  # no 0 * -inf, in backward too
    return -(logp.exp() * finite_logp).sum(-1)


class ActionDist:
    """Sampling, log-prob and entropy for one action space, from ``extra_info`` tensors."""

    param_keys: tuple[str, ...] = ()

    def __init__(self, space: gym.Space) -> None:
        self.space = space

    def check(self, info: dict, owner: str) -> None:
        missing = [k for k in self.param_keys if k not in info]
        if missing:
            raise AgentError(
                f"{owner}.act() returned extra_info without {missing} (keys: {sorted(info)}); PPO needs them for "
                f"{type(self.space).__name__} actions. Return them from act(), or override evaluate_actions()."
            )

    def sample(self, info: dict, deterministic: bool) -> torch.Tensor:
        raise NotImplementedError

    def log_prob(self, info: dict, actions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def entropy(self, info: dict) -> torch.Tensor:
        raise NotImplementedError


class CategoricalDist(ActionDist):
    param_keys = ("logits",)

    def sample(self, info, deterministic):
        return categorical_sample(info["logits"], deterministic)

    def log_prob(self, info, actions):
        return categorical_log_prob(info["logits"], actions)

    def entropy(self, info):
        return categorical_entropy(info["logits"])


class MultiCategoricalDist(ActionDist):
    """Independent categoricals; ``logits`` is their concatenation (sum(nvec) wide)."""

    param_keys = ("logits",)

    def __init__(self, space: gym.spaces.MultiDiscrete) -> None:
        super().__init__(space)
        self.nvec = [int(n) for n in np.asarray(space.nvec).reshape(-1)]

    def _split(self, logits):
        return torch.split(logits, self.nvec, dim=-1)

    def sample(self, info, deterministic):
        return torch.stack([categorical_sample(lg, deterministic) for lg in self._split(info["logits"])], -1)

    def log_prob(self, info, actions):
        parts = self._split(info["logits"])
        return sum(categorical_log_prob(lg, actions[..., i]) for i, lg in enumerate(parts))

    def entropy(self, info):
        return sum(categorical_entropy(lg) for lg in self._split(info["logits"]))


class GaussianDist(ActionDist):
    """Diagonal Gaussian over a flattened Box; actions are clipped to the bounds only when sent to the env."""

    param_keys = ("mean", "log_std")

    def sample(self, info, deterministic):
        mean = info["mean"]
        if deterministic:
            return mean
        return mean + torch.randn_like(mean) * info["log_std"].exp()

    def log_prob(self, info, actions):
        return gaussian_log_prob(info["mean"], info["log_std"], actions.reshape(info["mean"].shape))

    def entropy(self, info):
        return gaussian_entropy(info["mean"], info["log_std"])


def dist_for_space(space: gym.Space) -> ActionDist:
    if isinstance(space, gym.spaces.Discrete):
        return CategoricalDist(space)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return MultiCategoricalDist(space)
    if isinstance(space, gym.spaces.Box):
        return GaussianDist(space)
    raise AgentError(f"no built-in action distribution for {space}; use Discrete, MultiDiscrete or Box actions")


def action_param_size(space: gym.Space) -> int:
    """Width of the actor's output layer for a space (logits, or the Gaussian mean)."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.asarray(space.nvec).sum())
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    raise AgentError(f"no built-in action head for {space}; use Discrete, MultiDiscrete or Box actions")
