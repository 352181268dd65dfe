"""GRPO: group-relative advantages and a clipped, token-level policy loss. Pure functions, no I/O.

One task is sampled ``group_size`` times; each sample's advantage is its reward relative to the
others in its group, so no value network is needed. The loss is PPO's clipped surrogate over the
tokens the policy sampled (``mask == 1``), with the importance ratio taken against the logprobs the
engine recorded when it sampled them (the behaviour policy), plus an optional k3 KL penalty to a
frozen reference model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, method: str = "mean_std", eps: float = 1e-6) -> torch.Tensor:
    """Advantages for one group of rewards (shape ``[G]``).

    - ``mean_std``: ``(r - mean) / (std + eps)`` (GRPO, DeepSeekMath);
    - ``leave_one_out``: ``r_i - mean_{j != i} r_j`` (RLOO); unbiased, no division.

    A group whose rewards are all equal carries no signal: every advantage is 0.
    """
    r = rewards.to(torch.float64)
    g = r.numel()
    if g < 2:
        return torch.zeros_like(r, dtype=torch.float32)
    if method == "mean_std":
        adv = (r - r.mean()) / (r.std(unbiased=False) + eps)
    elif method == "leave_one_out":
        adv = r - (r.sum() - r) / (g - 1)
    else:
        raise ValueError(f"unknown advantage method {method!r}; use 'mean_std' or 'leave_one_out'")
    return adv.to(torch.float32)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """``logp[b, t]`` = log-prob of ``token_ids[b, t]`` given tokens ``< t`` (position 0 gets 0)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, token_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


@dataclass
class GRPOLossOutput:
    loss: torch.Tensor
    policy_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    # |learner - rollout| logprob over masked tokens: the engine/learner mismatch (bf16 vs fp32, kernels)
    logprob_gap_mean: float = 0.0
    logprob_gap_max: float = 0.0
    tis_weight_mean: float = 1.0


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float = 0.2,
    clip_range_high: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    normalizer: float | None = None,
    tis_cap: float | None = None,
) -> GRPOLossOutput:
    """Clipped surrogate + KL, summed over masked tokens and divided by ``normalizer``.

    Shapes: ``[B, T]`` for the per-token tensors; ``advantages`` is ``[B]`` (one per sequence) or
    ``[B, T]``. ``normalizer`` is the number of masked tokens in the *whole* batch, so gradient
    accumulation over micro-batches gives exactly the full-batch gradient (defaults to this mask's sum).

    ``tis_cap``: truncated importance sampling for the rollout/learner mismatch (the engine's logprobs
    are not exactly the learner's, e.g. bf16 against fp32): each token's loss is multiplied by the
    constant weight ``min(exp(learner_lp - rollout_lp), tis_cap)``, with ``learner_lp`` the learner's
    logprob without grad. ``None`` leaves the loss as it is.
    """
    mask = mask.to(logprobs.dtype)
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    n = float(normalizer) if normalizer is not None else float(mask.sum().clamp(min=1.0))
    log_ratio = (logprobs - old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    high = clip_range if clip_range_high is None else clip_range_high
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_range, 1.0 + high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    tis_w = None
    if tis_cap is not None:
        tis_w = torch.clamp(torch.exp((logprobs.detach() - old_logprobs) * mask), max=float(tis_cap))
        per_token = per_token * tis_w
    kl_val = torch.zeros((), dtype=logprobs.dtype)
    if ref_logprobs is not None and kl_coef > 0:
        d = (ref_logprobs - logprobs) * mask
        kl_tok = torch.exp(d) - d - 1.0  # k3: unbiased, non-negative
        per_token = per_token + kl_coef * kl_tok
        kl_val = (kl_tok * mask).sum() / n
    loss = (per_token * mask).sum() / n
    with torch.no_grad():
        m = mask.bool()
        clip_frac = ((ratio - 1.0).abs() > clip_range).float()[m].mean().item() if m.any() else 0.0
        ratio_mean = ratio[m].mean().item() if m.any() else 1.0
        pol = (-torch.minimum(unclipped, clipped) * mask).sum().item() / n
        gap = (logprobs.detach() - old_logprobs).abs()[m]
        gap_mean = gap.mean().item() if m.any() else 0.0
        gap_max = gap.max().item() if m.any() else 0.0
        tis_mean = tis_w[m].mean().item() if tis_w is not None and m.any() else 1.0
    return GRPOLossOutput(loss, pol, float(kl_val.detach()), clip_frac, ratio_mean, gap_mean, gap_max, tis_mean)
