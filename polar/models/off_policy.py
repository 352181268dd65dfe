"""Networks for the off-policy algorithms: a Q-network agent (DQN) and a squashed-Gaussian actor with
twin Q critics (SAC).

The *agent* is only what acts, so it is all a rollout worker receives; target networks and SAC's
critics live with the learner. Exploration settings the learner changes while training (DQN's
epsilon, the uniform-random warm-up before ``learning_starts``) are buffers of the agent, so they
travel to workers with the weights.
"""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from polar.agents import AgentBase
from polar.errors import ConfigError
from polar.models.actor_critic import numpy_views, plain_layers, run_numpy
from polar.models.encoders import Flatten, build_encoder, flat_dim, is_image_space, mlp

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # SB3 / the SAC paper's clamp on the actor's log std


def _zeros(batch: int) -> torch.Tensor:
    return torch.zeros(batch, dtype=torch.float32)


def _batch_size(obs) -> int:
    return next(iter(obs.values())).shape[0] if isinstance(obs, dict) else obs.shape[0]


class QNetworkAgent(AgentBase):
    """Q(s, .) over a Discrete action space; acts epsilon-greedily with the epsilon the learner publishes.

    ``act_numpy`` is ``act``'s numpy twin, pinned to it as PPO's is (``polar.algorithms.ppo_fused``):
    ``act_numpy_derived_from`` holds the source fingerprints of the methods it was derived from, and rollouts
    act through it only while the agent's methods still have them; an edited (or overriding) ``act`` or
    ``q_values`` is what rollouts then call. Whoever changes them on purpose re-derives ``act_numpy`` and the
    fingerprints (``tests/algorithms/test_dqn.py`` prints the new values)."""

    act_numpy_derived_from: ClassVar[dict[str, str]] = {"act": "30adc7ff24d1fffc", "q_values": "c60d9e98d6a104fd"}

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, hidden_sizes: list[int],
                 activation: str, cnn_channels: list[int]) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError(f"policy.type dqn needs a Discrete action space; this env's is {action_space}. "
                              "Use policy.type: sac for continuous (Box) actions, or ppo.")
        self.n_actions = int(action_space.n)
        encoder, dim = build_encoder(observation_space, hidden_sizes, activation, cnn_channels)
        self.q_net = nn.Sequential(encoder, nn.Linear(dim, self.n_actions))
        self.register_buffer("epsilon", torch.tensor(1.0))
        self.register_buffer("explore_uniform", torch.tensor(1.0))  # 1 until learning_starts: random actions
        self.bind_spaces(observation_space, action_space)

        self._fast = plain_layers(*self.q_net)  # Linear/activation stack over flat vectors, else None

    def q_values(self, obs) -> torch.Tensor:
        return self.q_net(obs)

    # --- numpy rollout path (see ActorCriticAgent.act_numpy): one env step costs a few numpy calls
    def supports_act_numpy(self) -> bool:
        return self._fast is not None

    def act_numpy(self, obs: np.ndarray, deterministic: bool = False):
        """(actions, log_probs, values) for a float32 batch, epsilon-greedy on the live weights."""
        key = self._fast[0][0].data_ptr()
        cache = self.__dict__.get("_np_cache")
        if cache is None or cache[0] != key:  # the optimizer re-pointed the parameters: new numpy views
            layers = numpy_views(self._fast)
            rng = cache[2] if cache is not None else np.random.default_rng(int(torch.randint(0, 2**31 - 1, (1,))))
            cache = (key, layers, rng)
            self.__dict__["_np_cache"] = cache
        _, layers, rng = cache
        q = run_numpy(layers, obs)
        action = q.argmax(-1)
        if not deterministic:
            eps = 1.0 if float(self.explore_uniform) > 0 else float(self.epsilon)
            if eps > 0:
                explore = rng.random(action.shape[0]) < eps
                action = np.where(explore, rng.integers(self.n_actions, size=action.shape[0]), action)
        return action, np.zeros(action.shape[0], np.float32), q.max(-1).astype(np.float32)

    def act(self, observation, internal_state=None, deterministic: bool = False):
        q = self.q_values(observation)
        action = q.argmax(-1)
        if not deterministic:
            eps = 1.0 if float(self.explore_uniform) > 0 else float(self.epsilon)
            if eps > 0:
                explore = torch.rand(action.shape) < eps
                action = torch.where(explore, torch.randint(self.n_actions, action.shape), action)
        batch = action.shape[0]
        return action, None, {"values": q.max(-1).values, "log_prob": _zeros(batch), "q_values": q}


class SquashedGaussianAgent(AgentBase):
    """SAC's actor: a Gaussian squashed by tanh and scaled to the Box bounds (actions never leave them)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, hidden_sizes: list[int],
                 activation: str, cnn_channels: list[int]) -> None:
        super().__init__()
        check_sac_action_space(action_space)
        self.action_dim = int(np.prod(action_space.shape))
        self.action_shape = tuple(action_space.shape)
        encoder, dim = build_encoder(observation_space, hidden_sizes, activation, cnn_channels)
        self.trunk = encoder
        self.mu = nn.Linear(dim, self.action_dim)
        self.log_std = nn.Linear(dim, self.action_dim)
        register_box_scale(self, action_space)
        self.register_buffer("explore_uniform", torch.tensor(1.0))  # 1 until learning_starts: uniform actions
        self.bind_spaces(observation_space, action_space)

    def _dist_params(self, obs) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(obs)
        return self.mu(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterized action (env scale) and the log-probability of its squashed form in [-1, 1]^d.

        The density is that of the tanh-squashed action, before scaling to the Box bounds (SB3's
        convention), so ``target_entropy: auto`` = -dim(A) means the same whatever the bounds."""
        mu, log_std = self._dist_params(obs)
        std = log_std.exp()
        u = mu + std * torch.randn_like(mu)
        squashed = torch.tanh(u)
        log_prob = (-0.5 * ((u - mu) / std) ** 2 - log_std - 0.5 * np.log(2 * np.pi)).sum(-1)
        # log|d tanh(u)/du| = log(1 - tanh(u)^2), in the numerically stable form 2(log 2 - u - softplus(-2u))
        log_prob = log_prob - (2.0 * (np.log(2.0) - u - nn.functional.softplus(-2.0 * u))).sum(-1)
        return self._to_env(squashed), log_prob

    def _to_env(self, squashed: torch.Tensor) -> torch.Tensor:
        return (squashed * self.action_scale + self.action_bias).reshape(-1, *self.action_shape)

    def act(self, observation, internal_state=None, deterministic: bool = False):
        batch = _batch_size(observation)
        if not deterministic and float(self.explore_uniform) > 0:
            squashed = torch.rand(batch, self.action_dim) * 2.0 - 1.0
        else:
            mu, log_std = self._dist_params(observation)
            u = mu if deterministic else mu + log_std.exp() * torch.randn_like(mu)
            squashed = torch.tanh(u)
        return self._to_env(squashed), None, {"values": _zeros(batch), "log_prob": _zeros(batch)}


def register_box_scale(module: nn.Module, action_space: gym.spaces.Box) -> None:
    """Buffers ``action_scale`` and ``action_bias``: env action = squashed * scale + bias, for squashed in [-1, 1]."""
    low = torch.as_tensor(action_space.low, dtype=torch.float32).reshape(-1)
    high = torch.as_tensor(action_space.high, dtype=torch.float32).reshape(-1)
    module.register_buffer("action_scale", (high - low) / 2.0)
    module.register_buffer("action_bias", (high + low) / 2.0)


class QCritic(nn.Module):
    """Q(s, a) for Box actions; actions are rescaled to [-1, 1] before they enter the network."""

    def __init__(self, observation_space: gym.Space, action_space: gym.spaces.Box, hidden_sizes: list[int],
                 activation: str, cnn_channels: list[int]) -> None:
        super().__init__()
        if isinstance(observation_space, gym.spaces.Dict) or is_image_space(observation_space):
            # encode first (one layer after the CNN / per key); the rest of the MLP sees [features, action]
            self.encoder, dim = build_encoder(observation_space, hidden_sizes[:1], activation, cnn_channels)
            rest = hidden_sizes[1:]
        else:  # as SB3: the whole MLP sees [flat observation, action]
            self.encoder, dim = Flatten(observation_space), flat_dim(observation_space)
            rest = hidden_sizes
        body, out = mlp(dim + int(np.prod(action_space.shape)), rest, activation)
        self.head = nn.Sequential(body, nn.Linear(out, 1))
        register_box_scale(self, action_space)

    def forward(self, obs, action: torch.Tensor) -> torch.Tensor:
        a = (action.reshape(action.shape[0], -1) - self.action_bias) / self.action_scale
        return self.head(torch.cat([self.encoder(obs), a], -1)).squeeze(-1)


def check_sac_action_space(action_space: gym.Space) -> None:
    if not isinstance(action_space, gym.spaces.Box):
        raise ConfigError(f"policy.type sac needs a Box (continuous) action space; this env's is {action_space}. "
                          "Use policy.type: dqn for Discrete actions, or ppo.")
    if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
        raise ConfigError(f"policy.type sac squashes actions into the Box bounds, so they must be finite; got "
                          f"low={action_space.low}, high={action_space.high}. Wrap the env to give finite bounds.")




def network_settings(cfg) -> tuple[list[int], str, list[int]]:
    """(hidden_sizes, activation, cnn_channels) for an off-policy run: the ``agent:`` section where set,
    else SB3's off-policy defaults (ReLU; 64-64 for DQN, 256-256 for SAC)."""
    agent = cfg.agent
    if agent.type not in ("mlp", "cnn"):
        raise ConfigError(f"agent.type {agent.type!r}: policy.type {cfg.policy.type} builds its own networks from "
                          "agent.type mlp or cnn (hidden_sizes, activation, cnn_channels); custom and lstm agents "
                          "train with ppo or appo.")
    # the algorithm's default (its kwargs' ``default_hidden``: SB3's for DQN and SAC, d3rlpy's for CQL)
    default_hidden = getattr(cfg.policy.kwargs, "default_hidden", [256, 256])
    hidden = agent.hidden_sizes if "hidden_sizes" in agent.model_fields_set else default_hidden
    activation = agent.activation if "activation" in agent.model_fields_set else "relu"
    if not hidden:
        raise ConfigError("agent.hidden_sizes: off-policy networks need at least one hidden layer, e.g. [64, 64]")
    return list(hidden), activation, list(agent.cnn_channels)


def build_off_policy_agent(cfg, observation_space: gym.Space, action_space: gym.Space) -> AgentBase:
    hidden, activation, channels = network_settings(cfg)
    actions = getattr(cfg.policy.kwargs, "actions", "either")  # which networks the algorithm trains
    if actions == "either":  # CQL: DQN's Q-network for Discrete actions, SAC's actor for Box ones
        discrete = isinstance(action_space, gym.spaces.Discrete)
        if not discrete and not (isinstance(action_space, gym.spaces.Box) and np.all(np.isfinite(action_space.low))
                                 and np.all(np.isfinite(action_space.high))):
            raise ConfigError(f"policy.type {cfg.policy.type} takes Discrete actions or a Box with finite bounds (its actor "
                              f"squashes into them); this env's is {action_space}. Wrap the env to give finite bounds.")
        cls = QNetworkAgent if discrete else SquashedGaussianAgent
    else:
        cls = QNetworkAgent if actions == "discrete" else SquashedGaussianAgent
    return cls(observation_space, action_space, hidden, activation, channels)
