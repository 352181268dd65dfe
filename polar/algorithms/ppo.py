"""PPO (Schulman et al. 2017) as pure functions plus a small learner that applies them.

Pure, reusable pieces (no I/O, no env knowledge):

- ``clipped_surrogate``: PPO's clipped importance-ratio objective, per sample. The one copy: PPO, APPO
  (``polar.algorithms.appo``) and GRPO (``polar.algorithms.grpo``) all call it.
- ``ppo_policy_loss`` / ``ppo_value_loss`` / ``ppo_loss``: the surrogate's mean, the value loss (MSE, SB3's
  convention: ``vf_coef * MSE``, no 1/2; APPO uses the same function), the entropy bonus.
- ``schedule_value``: constant / linear schedules (SB3's ``lin_<x>``: decays to 0 at the end).

``PPOLearner`` computes GAE on the rollout (``polar.algorithms.advantages``) and runs epochs x
minibatches with grad-norm clipping and an optional early stop on approximate KL. Each minibatch's
gradient comes from one function, ``autograd_step`` (``evaluate_actions``, ``ppo_loss``, ``backward``).
For the built-in MLP with ``policy.kwargs.fused: auto``, ``fused_step`` replaces exactly that function
with its hand-derived twin (``polar.algorithms.ppo_fused``; the same numbers, a fraction of the
overhead), and rollouts act through ``act``'s numpy twin; both run only while ``autograd_step``, the
agent's ``act``/``evaluate_actions`` and what they call are the source the twins were derived from
(``fused_pins``), so an edit there makes the run train by autograd and act through ``act``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Literal, Protocol

import torch
from torch import nn

from polar.agents import AgentBase
from polar.algorithms.advantages import normalize, rollout_gae
from polar.algorithms.optim import Adam, module_device
from polar.algorithms.ppo_fused import fused_ppo_grads, pinned_changes, supports_fused
from polar.algorithms.rnd import RND, combine, restore_intrinsic
from polar.config.ppo import DEFAULT_BATCH_SIZE, PPOKwargs
from polar.distributions import GaussianDist
from polar.errors import ConfigError
from polar.types import Batch, Rollout

log = logging.getLogger(__name__)


def schedule_value(initial: float, kind: str, progress: float) -> float:
    """Value of a schedule at ``progress`` in [0, 1] (fraction of total_env_steps done)."""
    if kind == "linear":
        return initial * max(0.0, 1.0 - progress)
    return initial


def clipped_surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, clip_range: float,
                      clip_range_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, to minimize, per sample: ``-min(r * A, clip(r, 1 - eps, 1 + eps_high) * A)``.

    ``log_ratio`` is ``log pi_new - log pi_old`` (``r = exp(log_ratio)``); ``clip_range_high`` defaults to
    ``clip_range`` (GRPO's DAPO-style asymmetric clip sets it). Returns the per-sample loss and ``r``.
    """
    ratio = torch.exp(log_ratio)
    high = clip_range if clip_range_high is None else clip_range_high
    return -torch.min(advantages * ratio, advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + high)), ratio


def clip_fraction(ratio: torch.Tensor, clip_range: float) -> torch.Tensor:
    """Share of samples whose ratio is outside ``[1 - clip_range, 1 + clip_range]`` (a diagnostic)."""
    with torch.no_grad():
        return ((ratio - 1.0).abs() > clip_range).float().mean()


def ppo_policy_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, clip_range: float):
    """Clipped surrogate (to minimize), the clip fraction and the ratio."""
    per_sample, ratio = clipped_surrogate(log_prob - old_log_prob, advantages, clip_range)
    return per_sample.mean(), clip_fraction(ratio, clip_range), ratio


def ppo_value_loss(values: torch.Tensor, old_values: torch.Tensor | None, returns: torch.Tensor,
                   clip_range_vf: float | None) -> torch.Tensor:
    """MSE to the returns (no 1/2: the loss adds ``vf_coef *`` this, as SB3 does); with ``clip_range_vf``
    the new value is clipped around the old one (SB3 style)."""
    if clip_range_vf is not None:
        values = old_values + torch.clamp(values - old_values, -clip_range_vf, clip_range_vf)
    return (returns - values).pow(2).mean()


def ppo_loss(log_prob, entropy, values, old_log_prob, old_values, advantages, returns, clip_range: float,
             clip_range_vf: float | None, ent_coef: float, vf_coef: float, normalize_advantage: bool = True,
             with_stats: bool = True):
    """Total PPO loss and its parts (``with_stats=False`` skips the diagnostics: fewer kernels per step)."""
    if normalize_advantage:
        advantages = normalize(advantages)
    per_sample, ratio = clipped_surrogate(log_prob - old_log_prob, advantages, clip_range)
    pg_loss = per_sample.mean()
    v_loss = ppo_value_loss(values, old_values, returns, clip_range_vf)
    loss = pg_loss + vf_coef * v_loss
    if ent_coef != 0.0:
        loss = loss - ent_coef * entropy.mean()
    if not with_stats:
        return loss, {}
    with torch.no_grad():
        log_ratio = log_prob - old_log_prob
        approx_kl = ((ratio - 1) - log_ratio).mean()
    return loss, {"pg_loss": pg_loss.detach(), "value_loss": v_loss.detach(), "entropy": entropy.detach().mean(),
                  "approx_kl": approx_kl, "clip_fraction": clip_fraction(ratio, clip_range)}


class PPOMinibatch(Protocol):
    """What one gradient step reads (``polar.buffers.rollout_buffer.Minibatch``)."""

    obs: torch.Tensor | dict[str, torch.Tensor]
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    initial_state: tuple[torch.Tensor, ...] | torch.Tensor | None
    episode_starts: torch.Tensor | None


def autograd_step(agent: AgentBase, mb: PPOMinibatch, clip_range: float, kw: PPOKwargs, normalize_advantage: bool,
                  with_stats: bool) -> dict[str, torch.Tensor]:
    """One minibatch's gradient, accumulated into ``.grad`` (zeroed by the caller): the agent's log-probs,
    entropy and values of the taken actions, ``ppo_loss`` on them, ``backward``. Returns the diagnostics
    (empty unless ``with_stats``). This is the function the fused path replaces (``fused_step``)."""
    logp, ent, values = agent.evaluate_actions(mb.obs, mb.actions, mb.initial_state, mb.episode_starts)
    loss, stats = ppo_loss(logp, ent, values, mb.log_probs, mb.values, mb.advantages, mb.returns, clip_range,
                           kw.clip_range_vf, kw.ent_coef, kw.vf_coef, normalize_advantage, with_stats=with_stats)
    loss.backward()
    return stats


def fused_step(agent: AgentBase, mb: PPOMinibatch, clip_range: float, kw: PPOKwargs, normalize_advantage: bool,
               with_stats: bool) -> dict[str, torch.Tensor]:
    """``autograd_step``'s twin for the built-in MLP: the same gradient, hand-derived and written into
    ``.grad`` (``polar.algorithms.ppo_fused``). Used only while ``fused_pins`` are unchanged."""
    adv = normalize(mb.advantages) if normalize_advantage else mb.advantages
    return fused_ppo_grads(agent, mb.obs, mb.actions, mb.log_probs, mb.values, adv, mb.returns, clip_range,
                           kw.clip_range_vf, kw.ent_coef, kw.vf_coef, with_stats)


def fused_pins(agent: nn.Module) -> dict[str, object]:
    """The roots of the code the fused path stands for, as the run would call them now (so a replaced
    function counts as a change): ``autograd_step``, the agent's ``act`` (the numpy acting twin),
    ``evaluate_actions`` and ``evaluate_outputs``, and the Gaussian's methods they call through the agent.
    ``polar.algorithms.ppo_fused.pinned_changes`` follows what these call by name."""
    return {"autograd_step": autograd_step,  # this module's global: what update() calls
            "ActorCriticAgent.act": getattr(agent, "act", None),
            "ActorCriticAgent.evaluate_actions": getattr(agent, "evaluate_actions", None),
            "ActorCriticAgent.evaluate_outputs": getattr(agent, "evaluate_outputs", None),
            "GaussianDist.sample": GaussianDist.sample, "GaussianDist.log_prob": GaussianDist.log_prob,
            "GaussianDist.entropy": GaussianDist.entropy}


FusedSetting = Literal["auto", "off"]


def fused_path(agent: nn.Module, fused: FusedSetting) -> tuple[bool, str]:
    """Whether a run with ``policy.kwargs.fused: <fused>`` takes the fused path (``fused_step`` and numpy
    acting) for ``agent``, and why, in the words of the run log."""
    if fused == "off":
        return False, "autograd (policy.kwargs.fused: off)"
    if not supports_fused(agent):
        return False, ("autograd (policy.kwargs.fused: auto; the agent is not the built-in MLP with separate actor "
                       "and critic and tanh/relu hidden layers)")
    changed = pinned_changes(fused_pins(agent))
    if changed:
        return False, (f"autograd (policy.kwargs.fused: auto; the code the fused path was derived from differs: "
                       f"{', '.join(changed)} changed; rollouts act through act)")
    return True, ("fused (policy.kwargs.fused: auto; built-in MLP and the stock autograd_step, evaluate_actions and "
                  "act: hand-derived gradients and numpy acting, tested equal to them; polar.algorithms.ppo_fused)")


class PPOLearner:
    """Owns the optimizer; ``update(rollout, progress)`` computes GAE and runs the PPO epochs on one batch."""

    def __init__(self, agent: nn.Module, kwargs: PPOKwargs, total_env_steps: int, intrinsic: RND | None = None) -> None:
        self.agent = agent
        # the reward module of policy.kwargs.intrinsic (polar.algorithms.rnd): its advantages join the extrinsic
        # ones before the epochs, so both gradient paths (autograd_step, fused_step) train on the same sum
        self.intrinsic = intrinsic
        if kwargs.intrinsic is not None and intrinsic is None:
            raise ConfigError("policy.kwargs.intrinsic is set, but this kind of run builds no reward module for it "
                              "(single-agent env runs do; PettingZoo runs do not yet); remove policy.kwargs.intrinsic")
        self.kw = kwargs
        self.total_env_steps = total_env_steps
        self.params = [p for p in agent.parameters() if p.requires_grad]
        self.device = module_device(agent)  # the trainer put the agent on the learner's device
        self.optimizer = Adam(self.params, lr=kwargs.learning_rate, eps=kwargs.adam_eps)
        self.fused, self.path = fused_path(agent, kwargs.fused)  # decided once, at the start of the run
        # data-parallel learners (polar.distributed.data_parallel): averages the gradient over the group before
        # each optimizer step, weighted by each learner's minibatch samples; None = one learner
        self.grad_sync: Callable[[Sequence[nn.Parameter], float], float] | None = None
        log.info("PPO update path: %s", self.path)

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

    def update(self, rollout: Batch[Rollout], /) -> dict[str, float]:
        """GAE on the batch's rollout buffer (rewards scaled by its ``reward_scale`` and clipped to
        ``reward_clip``), then the epochs x minibatches at the schedules' ``progress`` (the run's env steps over
        ``total_env_steps``); returns the mean diagnostics."""
        buf, reward_scale, reward_clip = rollout.data.buffer, rollout.data.reward_scale, rollout.data.reward_clip
        progress = min(1.0, rollout.run_env_steps / max(1, self.total_env_steps))
        kw = self.kw
        buf.advantages, buf.returns = rollout_gae(buf, kw.gamma, kw.gae_lambda, reward_scale, reward_clip)
        if self.intrinsic is not None and kw.intrinsic is not None:
            if buf.next_obs is None:
                raise ValueError("policy.kwargs.intrinsic: the rollout has no next observations (Fragment.next_obs); "
                                 "its collector must keep them (polar.rollout.runner.runner_options does)")
            intrinsic = self.intrinsic.advantages(buf.obs, buf.next_obs, buf.num_steps, buf.num_envs)
            buf.advantages = combine(buf.advantages, intrinsic, kw.intrinsic)
        buf.to(self.device)  # GAE runs on CPU (numpy); the epochs on the learner's device
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
        step = fused_step if self.fused else autograd_step  # fused_step: autograd_step's hand-derived twin
        for epoch in range(kw.n_epochs):
            epochs += 1
            stats_now = kw.target_kl is not None or epoch == kw.n_epochs - 1
            for batch in (buf.sequence_minibatches(mb) if recurrent else buf.minibatches(mb)):
                self.optimizer.zero_grad()
                st = step(self.agent, batch, clip, kw, norm_per_mb, stats_now)
                if kw.target_kl is not None and st["approx_kl"].item() > 1.5 * kw.target_kl:
                    stop = True
                    break
                if self.grad_sync is not None:
                    self.grad_sync(self.params, float(batch.log_probs.shape[0]))
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
        if self.intrinsic is not None:
            stats.update(self.intrinsic.train_on_batch())
        return stats

    def state_dict(self) -> dict:
        out = {"optimizer": self.optimizer.state_dict()}
        if self.intrinsic is not None:
            out["intrinsic"] = self.intrinsic.checkpoint()
        return out

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.intrinsic is not None:
            restore_intrinsic(self.intrinsic, state)


__all__ = ["PPOLearner", "PPOMinibatch", "autograd_step", "clip_fraction", "clipped_surrogate", "fused_path",
           "fused_pins", "fused_step", "ppo_loss", "ppo_policy_loss", "ppo_value_loss", "schedule_value"]
