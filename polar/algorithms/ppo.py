"""PPO (Schulman et al. 2017) as pure functions plus a small learner that applies them.

Pure, reusable pieces (no I/O, no env knowledge):

- ``compute_gae``: generalized advantage estimation over time-major ``[T, N]`` tensors.
- ``ppo_policy_loss`` / ``ppo_value_loss`` / ``ppo_loss``: clipped surrogate, optionally clipped value
  loss, entropy bonus.
- ``schedule_value``: constant / linear schedules (SB3's ``lin_<x>``: decays to 0 at the end).

``PPOLearner`` runs epochs x minibatches over a ``RolloutBuffer`` with grad-norm clipping and an
optional early stop on approximate KL.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from polar.algorithms.optim import Adam
from polar.algorithms.ppo_fused import fused_ppo_grads, supports_fused
from polar.buffers.rollout_buffer import RolloutBuffer
from polar.config.ppo import DEFAULT_BATCH_SIZE


def schedule_value(initial: float, kind: str, progress: float) -> float:
    """Value of a schedule at ``progress`` in [0, 1] (fraction of total_env_steps done)."""
    if kind == "linear":
        return initial * max(0.0, 1.0 - progress)
    return initial


def compute_gae(rewards, values, dones, last_values, gamma: float, gae_lambda: float):
    """Advantages and returns, ``[T, N]`` (numpy arrays or torch tensors; same type back).

    ``dones[t]`` ends the episode at step t (the step's target is then just its reward; truncated
    episodes must already carry ``gamma * V(final_obs)`` in their reward). ``last_values`` is V of the
    observation after the last step. Runs in numpy: T tiny vector ops are cheaper there than in torch.
    """
    is_torch = isinstance(rewards, torch.Tensor)
    r, v, d, last = (x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in (rewards, values, dones, last_values))
    T = r.shape[0]
    adv = np.empty_like(r)
    not_done = 1.0 - d
    gae = np.zeros_like(last)
    next_values = last
    for t in range(T - 1, -1, -1):
        delta = r[t] + gamma * next_values * not_done[t] - v[t]
        gae = delta + gamma * gae_lambda * not_done[t] * gae
        adv[t] = gae
        next_values = v[t]
    ret = adv + v
    if is_torch:
        return torch.from_numpy(adv), torch.from_numpy(ret)
    return adv, ret


def ppo_policy_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, clip_range: float):
    """Clipped surrogate (to minimize) and the clip fraction."""
    ratio = torch.exp(log_prob - old_log_prob)
    surr1 = advantages * ratio
    surr2 = advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = -torch.min(surr1, surr2).mean()
    with torch.no_grad():
        clip_frac = ((ratio - 1.0).abs() > clip_range).float().mean()
    return loss, clip_frac, ratio


def ppo_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_range_vf: float | None):
    """MSE to the returns; with ``clip_range_vf`` the new value is clipped around the old one (SB3 style)."""
    if clip_range_vf is not None:
        values = old_values + torch.clamp(values - old_values, -clip_range_vf, clip_range_vf)
    return (returns - values).pow(2).mean()


def normalize(advantages: torch.Tensor) -> torch.Tensor:
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8) if advantages.numel() > 1 else advantages


def ppo_loss(log_prob, entropy, values, old_log_prob, old_values, advantages, returns, clip_range: float,
             clip_range_vf: float | None, ent_coef: float, vf_coef: float, normalize_advantage: bool = True,
             with_stats: bool = True):
    """Total PPO loss and its parts (``with_stats=False`` skips the diagnostics: fewer kernels per step)."""
    if normalize_advantage:
        advantages = normalize(advantages)
    ratio = torch.exp(log_prob - old_log_prob)
    pg_loss = -torch.min(advantages * ratio, advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)).mean()
    v_loss = ppo_value_loss(values, old_values, returns, clip_range_vf)
    loss = pg_loss + vf_coef * v_loss
    if ent_coef != 0.0:
        ent = entropy.mean()
        loss = loss - ent_coef * ent
    if not with_stats:
        return loss, {}
    with torch.no_grad():
        log_ratio = log_prob - old_log_prob
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clip_frac = ((ratio - 1.0).abs() > clip_range).float().mean()
    return loss, {"pg_loss": pg_loss.detach(), "value_loss": v_loss.detach(), "entropy": entropy.detach().mean(),
                  "approx_kl": approx_kl, "clip_fraction": clip_frac}


class PPOLearner:
    """Owns the optimizer; ``update(buffer, progress)`` runs the PPO epochs on one batch."""

    def __init__(self, agent: nn.Module, kwargs, total_env_steps: int) -> None:
        self.agent = agent
        self.kw = kwargs
        self.total_env_steps = total_env_steps
        self.params = [p for p in agent.parameters() if p.requires_grad]
        self.optimizer = Adam(self.params, lr=kwargs.learning_rate, eps=kwargs.adam_eps)
        self.fused = supports_fused(agent) and not getattr(kwargs, "disable_fused", False)

    def minibatch_size(self, batch_samples: int, num_columns: int, recurrent: bool) -> int:
        """Samples per minibatch (flat; ``num_minibatches``, else ``batch_size``, else 64 samples, so the
        gradient steps per sample do not depend on the env count); for recurrent agents, env columns
        per minibatch (``batch_size`` samples' worth, else ``num_minibatches`` or 4 minibatches)."""
        kw = self.kw
        if recurrent:
            if kw.batch_size is not None:
                steps = batch_samples // num_columns
                return max(1, min(num_columns, kw.batch_size // max(1, steps)))
            return max(1, num_columns // (kw.num_minibatches or min(4, num_columns)))
        if kw.num_minibatches is not None:
            return max(1, batch_samples // kw.num_minibatches)
        return min(batch_samples, kw.batch_size or DEFAULT_BATCH_SIZE)

    def update(self, buf: RolloutBuffer, progress: float) -> dict[str, float]:
        kw = self.kw
        lr = schedule_value(kw.learning_rate, kw.lr_schedule, progress)
        clip = schedule_value(kw.clip_range, kw.clip_range_schedule, progress)
        self.optimizer.lr = lr
        recurrent = buf.initial_state is not None
        mb = self.minibatch_size(buf.num_samples, buf.num_envs, recurrent)
        sums: dict[str, torch.Tensor] = {}
        n_updates = 0
        n_stat_updates = 0
        stop = False
        epochs = 0
        # one minibatch = the whole batch: normalize advantages once, not once per epoch
        whole = (mb >= buf.num_envs) if recurrent else (mb >= buf.num_samples)
        if whole and kw.normalize_advantage:
            buf.advantages = normalize(buf.advantages)
        norm_per_mb = kw.normalize_advantage and not whole
        for epoch in range(kw.n_epochs):
            epochs += 1
            stats_now = kw.target_kl is not None or epoch == kw.n_epochs - 1
            for batch in (buf.sequence_minibatches(mb) if recurrent else buf.minibatches(mb)):
                if self.fused:  # same gradients as the autograd branch, without the graph (polar.algorithms.ppo_fused)
                    adv = normalize(batch.advantages) if norm_per_mb else batch.advantages
                    st = fused_ppo_grads(self.agent, batch.obs, batch.actions, batch.log_probs, batch.values, adv,
                                         batch.returns, clip, kw.clip_range_vf, kw.ent_coef, kw.vf_coef, stats_now)
                    if kw.target_kl is not None and st["approx_kl"].item() > 1.5 * kw.target_kl:
                        stop = True
                        break
                else:
                    logp, ent, values = self.agent.evaluate_actions(batch.obs, batch.actions, batch.initial_state,
                                                                    batch.episode_starts)
                    loss, st = ppo_loss(logp, ent, values, batch.log_probs, batch.values, batch.advantages, batch.returns,
                                        clip, kw.clip_range_vf, kw.ent_coef, kw.vf_coef, norm_per_mb, with_stats=stats_now)
                    if kw.target_kl is not None and st["approx_kl"].item() > 1.5 * kw.target_kl:
                        stop = True
                        break
                    self.optimizer.zero_grad()
                    loss.backward()
                if kw.max_grad_norm is not None:
                    self.optimizer.clip_grad_norm_(kw.max_grad_norm)
                self.optimizer.step()
                n_updates += 1
                n_stat_updates += bool(st)
                for k, v in st.items():
                    sums[k] = sums[k] + v if k in sums else v.clone()
            if stop:
                break
        n_stat = max(1, n_stat_updates)
        stats = {k: float(v) / n_stat for k, v in sums.items()}
        with torch.no_grad():
            var_y = buf.returns.var()
            stats["explained_variance"] = float("nan") if var_y == 0 else float(1 - (buf.returns - buf.values).var() / var_y)
        stats.update(learning_rate=lr, clip_range=clip, n_updates=n_updates, epochs=epochs)
        return stats

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])


__all__ = ["PPOLearner", "compute_gae", "ppo_loss", "ppo_policy_loss", "ppo_value_loss", "schedule_value"]
