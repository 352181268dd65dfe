"""APPO: asynchronous PPO with V-trace off-policy correction (IMPALA-style). Pure functions, no I/O.

Rollout fragments arrive time-major, shape ``[T, B]``, produced by a *behaviour* policy that may be
several updates behind the learner. V-trace (Espeholt et al. 2018, eq. 1) turns them into value
targets ``vs`` and policy-gradient advantages that are valid for the *current* (target) policy:

    delta_t = rho_t * (r_t + gamma_t * V(x_{t+1}) - V(x_t))
    vs_t    = V(x_t) + delta_t + gamma_t * c_t * (vs_{t+1} - V(x_{t+1}))
    adv_t   = rho_t * (r_t + gamma_t * vs_{t+1} - V(x_t))

with ``rho_t = min(rho_bar, pi/mu)`` and ``c_t = min(c_bar, pi/mu)``. ``gamma_t`` is ``gamma`` times
"not done", so traces never cross episode boundaries. Truncated episodes are bootstrapped by the
caller: add ``gamma * V(final_obs)`` to the reward of the truncating step and cut the trace there
(``bootstrap_truncated_rewards``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from polar.algorithms.optim import module_device
from polar.algorithms.ppo import clip_fraction, clipped_surrogate, ppo_value_loss
from polar.algorithms.rnd import RND, combine, restore_intrinsic
from polar.errors import ConfigError
from polar.types import Batch, Rollout


@dataclass
class VTraceReturns:
    vs: torch.Tensor  # [T, B] value targets
    pg_advantages: torch.Tensor  # [T, B] advantages for the policy gradient
    rhos: torch.Tensor  # [T, B] unclipped importance ratios pi/mu (for metrics)


@torch.no_grad()
def vtrace(
    behaviour_logp: torch.Tensor,
    target_logp: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    discounts: torch.Tensor,
    clip_rho: float = 1.0,
    clip_c: float = 1.0,
    clip_pg_rho: float | None = None,
) -> VTraceReturns:
    """V-trace targets for time-major ``[T, B]`` tensors; ``bootstrap_value`` is ``V(x_T)``, shape ``[B]``.

    ``discounts[t]`` is ``gamma`` where step ``t`` did not end its episode and 0 where it did.
    ``clip_pg_rho`` truncates the ratio in the advantage (defaults to ``clip_rho``).
    """
    if behaviour_logp.shape != target_logp.shape or rewards.shape != values.shape:
        raise ValueError(
            f"vtrace: shapes differ: behaviour_logp {tuple(behaviour_logp.shape)}, target_logp "
            f"{tuple(target_logp.shape)}, rewards {tuple(rewards.shape)}, values {tuple(values.shape)}"
        )
    rhos = torch.exp(target_logp - behaviour_logp)
    clipped_rhos = torch.clamp(rhos, max=clip_rho)
    cs = torch.clamp(rhos, max=clip_c)
    values_tp1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_tp1 - values)

    acc = torch.zeros_like(bootstrap_value)
    vs_minus_v = torch.empty_like(values)
    for t in range(values.shape[0] - 1, -1, -1):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + values

    vs_tp1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    pg_rhos = torch.clamp(rhos, max=clip_pg_rho if clip_pg_rho is not None else clip_rho)
    pg_advantages = pg_rhos * (rewards + discounts * vs_tp1 - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages, rhos=rhos)


def bootstrap_truncated_rewards(
    rewards: torch.Tensor, truncated: torch.Tensor, final_values: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Fold ``gamma * V(final_obs)`` into the reward of steps that ended by truncation (time limit)."""
    return rewards + gamma * final_values * truncated.to(rewards.dtype)


def episode_discounts(terminated: torch.Tensor, truncated: torch.Tensor, gamma: float) -> torch.Tensor:
    """``gamma`` where the episode goes on, 0 where it ended (terminated or truncated)."""
    done = torch.logical_or(terminated.bool(), truncated.bool())
    return gamma * (~done).to(torch.float32)


@dataclass
class APPOLossOut:
    loss: torch.Tensor
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor
    clip_fraction: torch.Tensor


def appo_loss(
    new_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    new_values: torch.Tensor,
    vs: torch.Tensor,
    entropy: torch.Tensor,
    clip_range: float,
    vf_coef: float,
    ent_coef: float,
) -> APPOLossOut:
    """PPO's clipped surrogate on V-trace advantages, plus a value loss towards ``vs`` and an entropy bonus.

    The ratio is against the behaviour policy that produced the data, so the clip bounds how far one
    update moves away from it however stale it was. Surrogate and value loss are PPO's own functions
    (``polar.algorithms.ppo``): the value loss is ``vf_coef * MSE``, no 1/2, as in PPO and SB3.
    """
    per_sample, ratio = clipped_surrogate(new_logp - behaviour_logp, advantages, clip_range)
    policy_loss = per_sample.mean()
    value_loss = ppo_value_loss(new_values, None, vs, None)
    ent = entropy.mean()
    loss = policy_loss + vf_coef * value_loss - ent_coef * ent
    return APPOLossOut(loss, policy_loss.detach(), value_loss.detach(), ent.detach(), clip_fraction(ratio, clip_range))


def _flat(x, n: int):
    if isinstance(x, dict):
        return {k: v.reshape(n, *v.shape[2:]) for k, v in x.items()}
    return x.reshape(n, *x.shape[2:])


def _index(x, idx):
    return {k: v[idx] for k, v in x.items()} if isinstance(x, dict) else x[idx]


def _as_tensor(x, device: torch.device | None = None):
    if isinstance(x, dict):
        return {k: torch.as_tensor(v, device=device) for k, v in x.items()}
    return torch.as_tensor(x, device=device)


def appo_update(agent, optimizer, fragment, kw, learner_version: int = 0,
                reward_scale: float = 1.0, reward_clip: float | None = None,
                intrinsic_advantages: torch.Tensor | None = None,
                grad_sync: Callable[[Sequence[torch.nn.Parameter], float], float] | None = None,
                num_minibatches: int | None = None) -> dict[str, float]:
    """One learner step on one rollout fragment (feed-forward agents): V-trace targets, then clipped updates.

    ``agent`` is the learner's agent (an ``AgentBase``); ``fragment`` a ``polar.rollout.Fragment``
    whose ``log_probs`` came from the (possibly older) behaviour policy. Returns scalar metrics.
    A learner group's rank passes ``grad_sync`` (the group's weighted gradient mean, weighted by each rank's
    minibatch samples) and ``num_minibatches`` (the same on every rank: each minibatch is one all-reduce).
    """
    if fragment.initial_state is not None:
        raise ConfigError(
            "policy.type: appo supports feed-forward agents only for now; this agent keeps an internal "
            "state. Use policy.type: ppo for recurrent agents."
        )
    T, N = fragment.num_steps, fragment.num_envs
    n = T * N
    dev = module_device(agent)  # the learner's device: every tensor of the update goes there
    obs = _flat(_as_tensor(fragment.obs, dev), n)
    actions = torch.as_tensor(fragment.actions, device=dev)
    actions = actions.reshape(n, *actions.shape[2:])
    behaviour_logp = torch.as_tensor(fragment.log_probs, dtype=torch.float32, device=dev)
    raw = torch.as_tensor(fragment.rewards, dtype=torch.float32, device=dev) * reward_scale
    if reward_clip is not None:
        raw = raw.clamp(-reward_clip, reward_clip)
    rewards = bootstrap_truncated_rewards(
        raw, torch.as_tensor(fragment.truncated, device=dev), torch.as_tensor(fragment.trunc_values, device=dev), kw.gamma
    )
    discounts = episode_discounts(torch.as_tensor(fragment.terminated, device=dev), torch.as_tensor(fragment.truncated, device=dev), kw.gamma)
    bootstrap = torch.as_tensor(fragment.last_values, dtype=torch.float32, device=dev)
    batch_size = kw.batch_size or n
    # one learner: minibatches of batch_size; a group's rank: num_minibatches slices, some maybe empty
    bounds = ([(start, start + batch_size) for start in range(0, n, batch_size)] if num_minibatches is None
              else [(m * n // num_minibatches, (m + 1) * n // num_minibatches) for m in range(num_minibatches)])
    params = [p for p in agent.parameters() if p.requires_grad]
    stats = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "clip_fraction": 0.0}
    updates, rho_sum = 0, 0.0
    for _ in range(kw.n_epochs):
        with torch.no_grad():
            target_logp, _, values = agent.evaluate_actions(obs, actions)
        vt = vtrace(
            behaviour_logp, target_logp.reshape(T, N), rewards, values.reshape(T, N), bootstrap, discounts,
            clip_rho=kw.vtrace_clip_rho, clip_c=kw.vtrace_clip_c,
        )
        adv = vt.pg_advantages
        if intrinsic_advantages is not None:  # policy.kwargs.intrinsic: ext_coef * A_vtrace + coef * A_int
            adv = combine(adv, intrinsic_advantages, kw.intrinsic)
        adv = adv.reshape(n)
        if kw.normalize_advantage and n > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        vs = vt.vs.reshape(n)
        flat_blogp = behaviour_logp.reshape(n)
        perm = torch.randperm(n).to(dev)
        for lo, hi in bounds:
            idx = perm[lo:hi]
            optimizer.zero_grad(set_to_none=True)
            if hi > lo:  # a group's rank may have none of this minibatch: it joins the all-reduce with weight 0
                new_logp, entropy, new_values = agent.evaluate_actions(_index(obs, idx), actions[idx])
                out = appo_loss(
                    new_logp, flat_blogp[idx], adv[idx], new_values, vs[idx], entropy,
                    clip_range=kw.clip_range, vf_coef=kw.vf_coef, ent_coef=kw.ent_coef,
                )
                out.loss.backward()
                stats["policy_loss"] += float(out.policy_loss)
                stats["value_loss"] += float(out.value_loss)
                stats["entropy"] += float(out.entropy)
                stats["clip_fraction"] += float(out.clip_fraction)
            if grad_sync is not None and grad_sync(params, float(hi - lo)) <= 0:
                continue
            torch.nn.utils.clip_grad_norm_(params, kw.max_grad_norm)
            optimizer.step()
            updates += 1
        rho_sum += float(vt.rhos.mean())
    out_stats = {k: v / max(updates, 1) for k, v in stats.items()}
    out_stats["vtrace_rho_mean"] = rho_sum / kw.n_epochs
    out_stats["n_updates"] = float(updates)  # gradient steps on this fragment, as PPO reports them
    out_stats["policy_lag"] = float(learner_version - fragment.policy_version)
    return out_stats


class APPOLearner:
    """The learner side of APPO: one update per arriving fragment; fragments too stale are dropped and counted.

    Same shape as ``PPOLearner`` (``state_dict``/``load_state_dict``) so the trainer checkpoints it alike.
    """

    def __init__(self, agent, kwargs, intrinsic: RND | None = None) -> None:
        self.agent = agent
        self.kw = kwargs
        # the reward module of policy.kwargs.intrinsic (polar.algorithms.rnd): its advantages (GAE with its own
        # critic, not V-trace corrected) join each epoch's V-trace advantages
        self.intrinsic = intrinsic
        self.optimizer = torch.optim.Adam(agent.parameters(), lr=kwargs.learning_rate, eps=kwargs.adam_eps)
        self.stale_dropped = 0
        # data-parallel learners (polar.distributed.data_parallel): averages the gradient over the group before
        # each optimizer step, weighted by each rank's minibatch samples; None = one learner
        self.grad_sync: Callable[[Sequence[torch.nn.Parameter], float], float] | None = None

    def update(self, batch: Batch[Rollout]) -> dict[str, float]:
        """Update on the batch's fragment, or skip it (``update_skipped: 1``) when it is more than
        ``max_policy_lag`` versions older than the learner (``batch.version``): a dropped fragment changes no
        weight, and publishing a new version for it would count a non-update as lag for every fragment in
        flight and cascade into more drops."""
        rollout, learner_version = batch.data, batch.version
        (fragment,) = rollout.fragments
        lag = learner_version - fragment.policy_version
        if self.kw.max_policy_lag and lag > self.kw.max_policy_lag:
            self.stale_dropped += 1
            return {"update_skipped": 1.0, "stale_dropped": float(self.stale_dropped)}
        intrinsic = None
        if self.intrinsic is not None:
            if fragment.next_obs is None:
                raise ValueError("policy.kwargs.intrinsic: the fragment has no next observations (Fragment.next_obs); "
                                 "its collector must keep them (polar.rollout.runner.runner_options does)")
            intrinsic = self.intrinsic.advantages(fragment.obs, fragment.next_obs, fragment.num_steps,
                                                  fragment.num_envs)
        # a group's ranks hold shards of one fragment: the minibatch count is the whole batch's (batch.env_steps)
        n_mini = None if self.grad_sync is None else max(1, -(-batch.env_steps // (self.kw.batch_size or batch.env_steps or 1)))
        stats = appo_update(self.agent, self.optimizer, fragment, self.kw, learner_version, rollout.reward_scale,
                            rollout.reward_clip, intrinsic, self.grad_sync, n_mini)
        if self.intrinsic is not None:
            stats.update(self.intrinsic.train_on_batch())
        stats["stale_dropped"] = float(self.stale_dropped)
        stats["update_skipped"] = 0.0
        return stats

    def state_dict(self) -> dict:
        out = {"optimizer": self.optimizer.state_dict(), "stale_dropped": self.stale_dropped}
        if self.intrinsic is not None:
            out["intrinsic"] = self.intrinsic.checkpoint()
        return out

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.stale_dropped = int(state.get("stale_dropped", 0))
        if self.intrinsic is not None:
            restore_intrinsic(self.intrinsic, state)
