"""The built-in actor-critic agents (``agent: {type: mlp | cnn | lstm}``)."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from polar.agents import AgentBase, reset_state
from polar.config.agent import BuiltinAgentConfig
from polar.distributions import (
    ACTION_MASK_KEY,
    CategoricalDist,
    GaussianDist,
    action_param_size,
    dist_for_space,
    gumbel_argmax,
    masked_categorical_entropy,
    masked_logits,
)
from polar.errors import ConfigError
from polar.models.encoders import build_encoder

_ACT_FNS = {nn.Tanh: torch.tanh, nn.ReLU: torch.relu}


def plain_layers(*modules: nn.Module):
    """[(weight, bias, activation)] when ``modules`` are only Linear layers and tanh/relu, else None.

    Calling ``F.linear`` on these directly skips ``nn.Module.__call__`` (hooks, dispatch): for a
    64-64 MLP on CPU that per-call overhead is a large part of the step time."""
    layers: list = []
    for m in modules:
        for sub in (m if isinstance(m, nn.Sequential) else [m]):
            if isinstance(sub, nn.Linear):
                layers.append([sub.weight, sub.bias, None])
            elif type(sub) in _ACT_FNS and layers and layers[-1][2] is None:
                layers[-1][2] = _ACT_FNS[type(sub)]
            else:
                return None
    return layers


def _run_layers(layers, x: torch.Tensor) -> torch.Tensor:
    for w, b, f in layers:
        x = torch.nn.functional.linear(x, w, b)
        if f is not None:
            x = f(x)
    return x


def numpy_views(layers) -> list:
    """``plain_layers`` as numpy views of the live parameters: [(weight.T, bias, activation)]."""
    return [(w.detach().numpy().T, b.detach().numpy(), f) for w, b, f in layers]


def run_numpy(layers, x: np.ndarray) -> np.ndarray:
    """Forward ``numpy_views`` layers over a batch (tanh/relu activations).

    In place after each matmul (the same float32 operations as ``x @ wt + b`` then the activation, fewer
    temporaries): at 8 envs a step's forward is a few microseconds of arithmetic and the rest allocation."""
    dot = np.dot if x.ndim == 2 else np.matmul  # np.dot: the same BLAS product as matmul's, less dispatch
    for wt, b, f in layers:
        x = dot(x, wt)
        np.add(x, b, out=x)
        if f is not None:
            if f is torch.tanh:
                np.tanh(x, out=x)
            else:
                np.maximum(x, 0, out=x)
    return x


def _sample_numpy(x: np.ndarray, noise: np.ndarray | None, categorical: bool, log_std: np.ndarray | None,
                  rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(actions, float32 log-probs) from the policy head's outputs ``x`` [N, P]: ``act``'s sampling in numpy.

    Categorical: Gumbel-max on the log-softmax (computed in place in ``x``), ``noise`` standard Gumbel;
    Gaussian: ``mean + std * noise``, ``noise`` standard normal. ``noise`` None: the deterministic action."""
    if categorical:  # log-softmax in place on the fresh logits: the same float32 operations, fewer arrays
        x -= x.max(-1, keepdims=True)
        lse = np.exp(x).sum(-1, keepdims=True)
        x -= np.log(lse, out=lse)
        a = x.argmax(-1) if noise is None else (x + noise).argmax(-1)
        return a, x[rows, a]
    assert log_std is not None
    std = np.exp(log_std)
    a = x if noise is None else x + std * noise
    diff = (a - x) / std
    logp = (-0.5 * diff * diff - log_std - 0.5 * np.log(2 * np.pi)).sum(-1)
    return a, logp.astype(np.float32, copy=False)


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
        args = (cfg.hidden_sizes, cfg.activation, cfg.cnn_channels, cfg.cnn_arch)
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
        self._categorical = isinstance(self._dist, CategoricalDist)
        # a Gymnasium action_mask in the observation Dict: forbidden actions get -inf logits when acting and in
        # the loss; the numpy acting path and the fused PPO gradients do not know masks, so they stay off
        self.masked = isinstance(observation_space, gym.spaces.Dict) and ACTION_MASK_KEY in observation_space.spaces
        if self.masked and not self._categorical:
            raise ConfigError(f"the observation has an {ACTION_MASK_KEY!r} but the action space is {action_space}; "
                              "action masks need Discrete actions")
        self._fast = None
        if not self.recurrent and self.vf_encoder is not None and not self.masked:
            pi, vf = plain_layers(self.pi_encoder, self.pi_head), plain_layers(self.vf_encoder, self.vf_head)
            if pi is not None and vf is not None:
                self._fast = (pi, vf)

    # --- numpy rollout path: act's twin, used by rollouts only on PPO's fused path (polar.rollout.runner) ------
    def supports_act_numpy(self) -> bool:
        """The numpy twin knows the plain MLP with tanh/relu hidden layers (``run_numpy``), nothing else."""
        if self._fast is None or not (self._categorical or self.gaussian):
            return False
        return all(f is None or f in (torch.tanh, torch.relu) for layers in self._fast for _, _, f in layers)

    def _numpy_layers(self):
        """numpy views of the live parameters (rebuilt if the optimizer re-pointed them)."""
        key = self._fast[0][0][0].data_ptr()
        cache = self.__dict__.get("_np_cache")
        if cache is None or cache[0] != key:
            log_std = self.log_std.detach().numpy() if self.gaussian else None
            seed = int(torch.randint(0, 2**31 - 1, (1,)).item())  # follows the torch seed: reproducible
            rng = cache[4] if cache is not None else np.random.default_rng(seed)
            cache = (key, numpy_views(self._fast[0]), numpy_views(self._fast[1]), log_std, rng)
            self.__dict__["_np_cache"] = cache
        return cache

    def act_numpy(self, obs: np.ndarray, deterministic: bool = False, with_values: bool = True):
        """(actions, log_probs, values) for a float32 batch, computed in numpy on the live weights.

        Same function as ``act`` (its own random stream); for tiny MLPs numpy's per-call cost is a fraction
        of torch's, which matters once per env step. It stands for ``act`` as pinned in
        ``polar.algorithms.ppo_fused.DERIVED_FROM``: once ``act`` is edited, rollouts call ``act`` instead.
        ``with_values=False`` skips the critic (values None): the runner then takes a fragment's values in
        one ``values_numpy`` call over all its observations, since the weights do not move while it collects."""
        _, pi, _, log_std, rng = self._numpy_layers()
        x = run_numpy(pi, obs)
        noise = None
        if not deterministic:
            noise = (rng.gumbel(size=x.shape) if self._categorical else rng.standard_normal(x.shape)).astype(np.float32)
        a, logp = _sample_numpy(x, noise, self._categorical, log_std, self._rows(len(x)))
        return a, logp, self.values_numpy(obs) if with_values else None

    def draw_noise(self, num_steps: int, num_envs: int) -> np.ndarray:
        """The sampling noise of ``num_steps`` ``act_numpy`` calls on ``num_envs`` rows, drawn at once:
        ``[num_steps, num_envs, action params]`` float32, standard Gumbel (Discrete) or standard normal (Box).

        numpy's generators fill an array element by element from one stream, so row ``t`` holds exactly what
        the ``t``-th call would have drawn."""
        rng = self._numpy_layers()[4]
        shape = (num_steps, num_envs, self.pi_head.out_features)
        return (rng.gumbel(size=shape) if self._categorical else rng.standard_normal(shape)).astype(np.float32)

    def rollout_actor(self, num_steps: int, num_envs: int) -> Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]:
        """``act_numpy`` without values for one fragment: ``actor(obs, t) -> (actions, log_probs)`` at step ``t``.

        The same actions and log-probs as ``num_steps`` calls of ``act_numpy`` (bit for bit), with less per-step
        work: the sampling noise drawn at once (``draw_noise``), the actor's weights copied once in their own
        memory order (a C-order copy rounds differently) and its biases tiled to ``num_envs`` rows (numpy adds equal shapes without broadcasting), and the layers
        written into buffers kept for the fragment. The copy is taken now: build one per fragment, while the
        weights do not move (as the runner's end-of-fragment values already assume)."""
        _, pi, _, log_std, _ = self._numpy_layers()
        noise = self.draw_noise(num_steps, num_envs)
        layers = [(wt.copy(order="K"), np.tile(b, (num_envs, 1)), f) for wt, b, f in pi]
        bufs = [np.empty((num_envs, wt.shape[1]), np.float32) for wt, _, _ in layers]
        rows, categorical = np.arange(num_envs), self._categorical
        log_std = None if log_std is None else log_std.copy()

        def actor(obs: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
            x = obs
            for (wt, b, f), buf in zip(layers, bufs, strict=True):
                x = np.dot(x, wt, out=buf)
                np.add(x, b, out=x)
                if f is torch.tanh:
                    np.tanh(x, out=x)
                elif f is not None:
                    np.maximum(x, 0, out=x)
            return _sample_numpy(x, noise[t], categorical, log_std, rows)

        return actor

    def _rows(self, n: int) -> np.ndarray:
        """``np.arange(n)``, kept: the row index of the sampled log-prob at every step."""
        rows = self.__dict__.get("_rows_cache")
        if rows is None or len(rows) != n:
            rows = self.__dict__["_rows_cache"] = np.arange(n)
        return rows  # type: ignore[no-any-return]

    def values_numpy(self, obs: np.ndarray) -> np.ndarray:
        """The critic of ``act_numpy`` over float32 observations ``[..., obs_dim]``: values ``[...]``.

        A fragment's ``[T, N, obs_dim]`` goes through numpy's stacked matmul, one ``[N, obs_dim]`` product per
        step in C: bit for bit the values ``act_numpy`` gives step by step (one ``[T * N, obs_dim]`` product
        would round differently)."""
        return run_numpy(self._numpy_layers()[2], obs)[..., 0]  # type: ignore[no-any-return]

    def get_initial_state(self, batch_size: int = 1):
        if not self.recurrent:
            return None
        h = torch.zeros(batch_size, self.cfg.lstm_hidden_size)
        return (h, h.clone())

    def _params(self, pi_feat: torch.Tensor, observation=None) -> dict:
        out = self.pi_head(pi_feat)
        if self.gaussian:
            return {"mean": out, "log_std": self.log_std}
        if self.masked:
            mask = observation[ACTION_MASK_KEY]
            out = masked_logits(out, mask.reshape(out.shape) if mask.dim() != out.dim() else mask)
        return {"logits": out}

    def _log_prob_entropy(self, info: dict, actions: torch.Tensor):
        if self.masked:  # the masked categorical: log-probs renormalized over the legal actions, their entropy
            return self._dist.log_prob(info, actions), masked_categorical_entropy(info["logits"])
        return self._dist.log_prob(info, actions), self._dist.entropy(info)

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
        if self._fast is not None:
            out = _run_layers(self._fast[0], observation.float() if observation.dtype != torch.float32 else observation)
            info = {"mean": out, "log_std": self.log_std} if self.gaussian else {"logits": out}
            values = _run_layers(self._fast[1], observation.float() if observation.dtype != torch.float32 else observation)
            state = None
        else:
            pi_feat, vf_feat, state = self._forward(observation, internal_state)
            info = self._params(pi_feat, observation)
            values = self.vf_head(vf_feat)
        if self._categorical:
            logp_all = torch.log_softmax(info["logits"], -1)
            if deterministic:
                action = logp_all.argmax(-1, keepdim=True)
            else:
                action = gumbel_argmax(logp_all)
            info["log_prob"] = logp_all.gather(-1, action).squeeze(-1)
            action = action.squeeze(-1)
        else:
            action = self._dist.sample(info, deterministic)
            info["log_prob"] = self._dist.log_prob(info, action)
        info["values"] = values.squeeze(-1)
        return action, state, info

    def evaluate_outputs(self, pi_out: torch.Tensor, values: torch.Tensor, actions: torch.Tensor):
        """(log_prob, entropy, values) of ``actions`` from the plain MLP heads' outputs ``[B, P]`` and ``[B]``:
        where ``evaluate_actions`` ends for the built-in MLP. The fused PPO gradient
        (``polar.algorithms.ppo_fused``) is derived by hand from this code, so it is pinned with
        ``evaluate_actions`` and ``act``: an edit to any of them makes PPO train by autograd."""
        if self._categorical:
            logp_all = torch.log_softmax(pi_out, -1)
            logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            return logp, -(logp_all.exp() * logp_all).sum(-1), values
        info = {"mean": pi_out, "log_std": self.log_std} if self.gaussian else {"logits": pi_out}
        return self._dist.log_prob(info, actions), self._dist.entropy(info), values

    def evaluate_actions(self, observation, actions, internal_state=None, episode_starts=None):
        if self._fast is not None:
            x = observation.float() if observation.dtype != torch.float32 else observation
            return self.evaluate_outputs(_run_layers(self._fast[0], x), _run_layers(self._fast[1], x).squeeze(-1), actions)
        if not self.recurrent:
            pi_feat, vf_feat, _ = self._forward(observation, None)
            info = self._params(pi_feat, observation)
            return (*self._log_prob_entropy(info, actions), self.vf_head(vf_feat).squeeze(-1))
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
        info = self._params(feat, observation)
        return (*self._log_prob_entropy(info, actions), self.vf_head(feat).squeeze(-1))
