"""Random Network Distillation (Burda et al. 2018, arXiv:1810.12894) as a reward module of on-policy learners.

The intrinsic reward of the transition into ``s'`` is the predictor's error ``||f(s') - g(s')||^2`` against a fixed
random target ``g``, on observations normalized by a running mean/std and clipped to ``obs_clip``. ``s'`` is the
observation the step reached (``Fragment.next_obs``: the final one where an episode ended), so every step of a
batch, the last of each env column included, is scored and trains the predictor. As in the paper (and CleanRL's
``ppo_rnd_envpool.py``):

- rewards are divided by a running std of the *discounted intrinsic return* (a forward filter per env column,
  never reset at episode ends), so the bonus keeps one scale while the predictor improves;
- the intrinsic return is non-episodic (an episode's end does not cut it: exploring past a reset is still new)
  and has its own critic, here the module's ``critic`` (the paper's second value head), trained beside the
  predictor; the policy's advantage is ``ext_coef * A_ext + coef * A_int``;
- the predictor trains on a random ``update_proportion`` of each minibatch, so it does not learn too fast.

Where this differs: the predictor and critic are MLPs on the flattened observation (the paper: CNNs on Atari
frames), and the observation normalizer has no warm-up phase of random-policy steps: each batch is folded in
before it is scored, so the first batch (a near-uniform fresh policy's) is normalized by its own moments. The
learner owns one ``RND``: its networks, optimizer and normalizers are part of the learner's checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from polar.algorithms.advantages import compute_gae
from polar.algorithms.optim import Adam
from polar.config.intrinsic import RNDConfig

ObsBatch: TypeAlias = "torch.Tensor | dict[str, torch.Tensor]"


def _mlp(in_dim: int, hidden: list[int], out_dim: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(in_dim, h), nn.ReLU()]
        in_dim = h
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class RunningMoments(nn.Module):
    """Running mean/variance (Chan et al.'s parallel update, as ``polar.models.normalization.RunningNorm``, which
    this layer may not import); ``forward`` normalizes and clips."""

    def __init__(self, shape: tuple[int, ...], clip: float) -> None:
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    def update(self, batch_mean: torch.Tensor, batch_var: torch.Tensor, batch_count: float) -> None:
        delta = batch_mean.double() - self.mean
        total = self.count + batch_count
        m2 = self.var * self.count + batch_var.double() * batch_count + delta.pow(2) * self.count * batch_count / total
        self.mean += delta * batch_count / total
        self.var.copy_(m2 / total)
        self.count.fill_(float(total))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean.float()) / (self.var.float() + 1e-8).sqrt()).clamp(-self.clip, self.clip)


def _width(space: gym.Space[Any]) -> int:
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    return int(np.prod(space.shape or (1,)))


class ObsFlattener(nn.Module):
    """Any observation space as float vectors ``[B, D]``: a Dict's keys in order, Discrete and MultiDiscrete
    one-hot, Box and MultiBinary flattened."""

    def __init__(self, space: gym.Space[Any]) -> None:
        super().__init__()
        self.keys = list(space.spaces) if isinstance(space, gym.spaces.Dict) else None
        self.subspaces = [space.spaces[k] for k in self.keys] if self.keys is not None else [space]
        self.dim = sum(_width(s) for s in self.subspaces)

    @staticmethod
    def _one(space: gym.Space[Any], x: torch.Tensor) -> torch.Tensor:
        if isinstance(space, gym.spaces.Discrete):
            return nn.functional.one_hot(x.long().reshape(-1) - int(space.start), int(space.n)).float()
        if isinstance(space, gym.spaces.MultiDiscrete):
            cols = x.long().reshape(x.shape[0], -1)
            return torch.cat([nn.functional.one_hot(cols[:, i], int(n)).float()
                              for i, n in enumerate(np.asarray(space.nvec).reshape(-1))], -1)
        return x.reshape(x.shape[0], -1).float()

    def forward(self, obs: ObsBatch) -> torch.Tensor:
        if self.keys is None:
            assert isinstance(obs, torch.Tensor)
            return self._one(self.subspaces[0], obs)
        assert isinstance(obs, dict)
        return torch.cat([self._one(s, obs[k]) for k, s in zip(self.keys, self.subspaces, strict=True)], -1)


def _flat_rows(obs: ObsBatch, rows: int) -> ObsBatch:
    """``[T, N, ...]`` observations as ``[T*N, ...]``."""
    if isinstance(obs, dict):
        return {k: torch.as_tensor(v).reshape(rows, *v.shape[2:]) for k, v in obs.items()}
    return torch.as_tensor(obs).reshape(rows, *obs.shape[2:])


def _index(obs: ObsBatch, idx: torch.Tensor) -> ObsBatch:
    return {k: v[idx] for k, v in obs.items()} if isinstance(obs, dict) else obs[idx]


def _last_row(obs: ObsBatch, num_steps: int, num_envs: int) -> ObsBatch:
    """The rows of step ``num_steps - 1`` of flat ``[T*N, ...]`` observations."""
    return _index(obs, torch.arange((num_steps - 1) * num_envs, num_steps * num_envs))


class RND(nn.Module):
    """The reward module: ``advantages(obs, T, N)`` scores a batch and returns its intrinsic advantages,
    ``train_on(obs)`` then fits the predictor and the intrinsic critic to it. ``metrics`` of the last batch are
    logged as ``intrinsic/*``."""

    def __init__(self, space: gym.Space[Any], cfg: RNDConfig, device: torch.device | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.flatten = ObsFlattener(space)
        d = self.flatten.dim
        self.obs_norm = RunningMoments((d,), cfg.obs_clip)
        self.target = _mlp(d, cfg.hidden_sizes, cfg.embedding_dim)
        self.predictor = _mlp(d, cfg.hidden_sizes, cfg.embedding_dim)
        self.critic = _mlp(d, cfg.hidden_sizes, 1)
        for p in self.target.parameters():
            p.requires_grad_(False)
        self.return_norm = RunningMoments((), 10.0)  # running std of the discounted intrinsic return
        self.return_filter: torch.Tensor
        self.register_buffer("return_filter", torch.zeros(0, dtype=torch.float64))  # per env column
        self.to(device or torch.device("cpu"))
        self.optimizer = Adam([*self.predictor.parameters(), *self.critic.parameters()], lr=cfg.learning_rate)
        self._returns: torch.Tensor | None = None
        self._obs: ObsBatch | None = None
        self._next_obs: ObsBatch | None = None
        self.metrics: dict[str, float] = {}

    @property
    def device(self) -> torch.device:
        return self.obs_norm.mean.device

    def _inputs(self, obs: ObsBatch) -> torch.Tensor:
        return self.obs_norm(self.flatten(obs))

    def novelty(self, obs: ObsBatch) -> torch.Tensor:
        """The unnormalized bonus of each observation ``[B]``: the predictor's squared error (no gradient)."""
        with torch.no_grad():
            x = self._inputs(obs)
            return (self.predictor(x) - self.target(x)).pow(2).sum(-1)

    def _filtered_std(self, rewards: torch.Tensor) -> float:
        """Update the running std of the discounted intrinsic return with ``rewards [T, N]``; return it."""
        n = rewards.shape[1]
        if self.return_filter.shape != (n,):  # first batch, or the env count changed (Ray resizing)
            self.return_filter = torch.zeros(n, dtype=torch.float64, device=self.device)
        running = self.return_filter
        rets = []
        for t in range(rewards.shape[0]):
            running = running * self.cfg.gamma + rewards[t].double()
            rets.append(running)
        self.return_filter = running
        stacked = torch.stack(rets)
        self.return_norm.update(stacked.mean(), stacked.var(unbiased=False), float(stacked.numel()))
        return float((self.return_norm.var + 1e-8).sqrt())

    def advantages(self, obs: ObsBatch, next_obs: ObsBatch, num_steps: int, num_envs: int) -> torch.Tensor:
        """Intrinsic advantages ``[T, N]`` of a batch: ``obs[t]`` is the policy's input at step t, ``next_obs[t]``
        the observation step t reached (the *final* one where an episode ended: ``Fragment.next_obs``). Step t's
        bonus is the novelty of ``next_obs[t]``, normalized; then GAE with the module's critic over the batch with
        no episode end (non-episodic: after a reset the stream goes on at ``obs[t + 1]``, and the last step
        bootstraps from ``next_obs[-1]``). Also folds ``next_obs`` into the observation normalizer first."""
        cfg, rows = self.cfg, num_steps * num_envs
        obs, nxt = self._on_device(_flat_rows(obs, rows)), self._on_device(_flat_rows(next_obs, rows))
        flat = self.flatten(nxt)
        self.obs_norm.update(flat.double().mean(0), flat.double().var(0, unbiased=False), float(rows))
        raw = self.novelty(nxt).reshape(num_steps, num_envs)
        std = self._filtered_std(raw)
        rewards = raw / std
        with torch.no_grad():
            values = self.critic(self._inputs(obs)).reshape(num_steps, num_envs)
            last = self.critic(self._inputs(_last_row(nxt, num_steps, num_envs))).reshape(num_envs)
        a, r = compute_gae(rewards.float().cpu(), values.cpu(), torch.zeros(num_steps, num_envs), last.cpu(),
                           cfg.gamma, cfg.gae_lambda)  # non-episodic: no episode end cuts the intrinsic return
        self.metrics = {"intrinsic/reward_mean": float(rewards.mean()), "intrinsic/reward_raw_mean":
                        float(raw.mean()), "intrinsic/return_std": std}
        self._returns, self._obs, self._next_obs = r.to(self.device).reshape(rows), obs, nxt
        return a.to(self.device)

    def _on_device(self, obs: ObsBatch) -> ObsBatch:
        return {k: v.to(self.device) for k, v in obs.items()} if isinstance(obs, dict) else obs.to(self.device)

    def train_on_batch(self) -> dict[str, float]:
        """Fit the predictor (a random ``update_proportion`` of each minibatch) and the intrinsic critic (towards
        the intrinsic returns) on the batch ``advantages`` scored last; returns this batch's ``intrinsic/*``."""
        assert self._returns is not None and self._obs is not None and self._next_obs is not None, "advantages() first"
        cfg = self.cfg
        obs, nxt, returns = self._obs, self._next_obs, self._returns
        idx_all = torch.arange(returns.numel(), device=self.device)
        pred_sum, value_sum, n = 0.0, 0.0, 0
        for _ in range(cfg.n_epochs):
            perm = idx_all[torch.randperm(idx_all.numel(), device=self.device)]
            for start in range(0, perm.numel(), cfg.batch_size):
                idx = perm[start:start + cfg.batch_size]
                x = self._inputs(_index(nxt, idx))  # the predictor learns the states the bonus was paid for
                err = (self.predictor(x) - self.target(x)).pow(2).sum(-1)
                mask = (torch.rand(err.shape[0], device=self.device) < cfg.update_proportion).float()
                pred_loss = (err * mask).sum() / mask.sum().clamp(min=1.0)
                value_loss = (self.critic(self._inputs(_index(obs, idx))).squeeze(-1) - returns[idx]).pow(2).mean()
                self.optimizer.zero_grad()
                (pred_loss + value_loss).backward()
                self.optimizer.step()
                pred_sum, value_sum, n = pred_sum + pred_loss.item(), value_sum + value_loss.item(), n + 1
        self._returns = self._obs = self._next_obs = None
        out = {**self.metrics, "intrinsic/predictor_loss": pred_sum / max(1, n),
               "intrinsic/value_loss": value_sum / max(1, n)}
        self.metrics = {}
        return out

    def checkpoint(self) -> dict[str, Any]:
        """Networks, normalizers, the return filter and the optimizer (the learner's checkpoint holds it)."""
        return {"modules": self.state_dict(), "optimizer": self.optimizer.state_dict()}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.return_filter = torch.as_tensor(state["modules"]["return_filter"], device=self.device)
        self.load_state_dict(state["modules"])
        self.optimizer.load_state_dict(state["optimizer"])


def make_intrinsic(space: gym.Space[Any], cfg: RNDConfig | None, device: torch.device) -> RND | None:
    """The reward module ``policy.kwargs.intrinsic`` names, on the learner's device (None when unset)."""
    return None if cfg is None else RND(space, cfg, device)


def restore_intrinsic(module: RND, learner_state: Mapping[str, Any]) -> None:
    """Load a learner checkpoint's ``intrinsic`` share into ``module``; one line when the checkpoint has none."""
    if "intrinsic" not in learner_state:
        raise ValueError("policy.kwargs.intrinsic is set but the checkpoint has no intrinsic reward module (it was "
                         "saved by a run without one); resume with the config it was trained with")
    module.restore(learner_state["intrinsic"])


def combine(extrinsic: torch.Tensor, intrinsic: torch.Tensor, cfg: RNDConfig) -> torch.Tensor:
    """The policy's advantage: ``ext_coef * A_ext + coef * A_int``."""
    return cfg.ext_coef * extrinsic + cfg.coef * intrinsic.to(extrinsic.device)


__all__ = ["RND", "ObsFlattener", "RunningMoments", "combine", "make_intrinsic", "restore_intrinsic"]
