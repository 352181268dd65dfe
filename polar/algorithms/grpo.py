"""GRPO: group-relative advantages and a clipped, token-level policy loss. Pure functions, no I/O.

One task is sampled ``group_size`` times; each sample's advantage is its reward relative to the
others in its group, so no value network is needed (``advantage: value_head`` swaps the group baseline
for a learned critic over the LLM's hidden states, ``polar.algorithms.llm_critic``: PPO with a value head). The loss is PPO's clipped surrogate
(``polar.algorithms.ppo.clipped_surrogate``, the one copy) over the
tokens the policy sampled (``mask == 1``), with the importance ratio taken against the logprobs the
engine recorded when it sampled them (the behaviour policy), plus an optional k3 KL penalty to a
frozen reference model.

``GRPOLearner.update(batch)`` takes one step's groups of agent sessions (``Batch[Groups]``, from
``polar.rollout.sessions.collector.SessionCollector``) and does the whole step: drop ERROR/CANCELLED sessions and
stale groups, group-relative advantages (``group_batch``; ``return_batch`` with the value head), the clipped
update (``optimize``). A step with no usable group updates nothing and says ``update_skipped: 1``; with
``kl_coef > 0`` a group tied below the best reward seen so far stays in at advantage 0, so the KL to the
reference still trains on it (one tied at the best reward is dropped: a KL-only pull would undo what was
learned).
"""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from polar.algorithms.llm_critic import (
    ValueHead,
    explained_variance,
    per_token,
    state_positions,
    turns_per_row,
    value_advantages,
)
from polar.algorithms.ppo import clipped_surrogate, ppo_value_loss
from polar.config.grpo import GRPOKwargs, StepAdvantageConfig
from polar.errors import ConfigError
from polar.types import Batch, Metrics, SessionResult, SessionStatus, TrajectorySample

log = logging.getLogger(__name__)

Groups = list[list[SessionResult]]
"""One GRPO step's input: groups of sessions of one task each."""

# below this share of groups with a signal per step, the learner says so and suggests what helps
LOW_SIGNAL_SHARE = 0.25


def group_advantages(rewards: torch.Tensor, method: str = "mean_std", eps: float = 1e-6) -> torch.Tensor:
    """Advantages for one group of rewards (shape ``[G]``).

    - ``mean_std``: ``(r - mean) / (std + eps)`` (GRPO, DeepSeekMath);
    - ``mean``: ``r - mean`` (Dr.GRPO, Liu et al., 2025): no std division, so a group of nearly equal rewards
      is not blown up to unit scale;
    - ``leave_one_out``: ``r_i - mean_{j != i} r_j`` (RLOO); unbiased, no division.

    A group whose rewards are all equal carries no signal: every advantage is 0.
    """
    r = rewards.to(torch.float64)
    g = r.numel()
    if g < 2:
        return torch.zeros_like(r, dtype=torch.float32)
    if method == "mean_std":
        adv = (r - r.mean()) / (r.std(unbiased=False) + eps)
    elif method == "mean":
        adv = r - r.mean()
    elif method == "leave_one_out":
        adv = r - (r.sum() - r) / (g - 1)
    else:
        raise ValueError(f"unknown advantage method {method!r}; use 'mean_std', 'mean' or 'leave_one_out'")
    return adv.to(torch.float32)


# ---------------------------------------------------------------- session groups -> samples and advantages


def overlong(r: SessionResult) -> bool:
    """True for a session that was cut rather than finished: its timeout or budget ran out, or its last model
    call stopped at ``max_tokens`` (``finish_reason: length``)."""
    return r.status == SessionStatus.TIMEOUT or any(s.metadata.get("truncated") for s in r.samples[-1:])


def _usable(group: list[SessionResult], overlong_filter: bool = False,
            stats: defaultdict[str, float] | None = None) -> list[SessionResult]:
    """The sessions with a verdict (DONE, or TIMEOUT's 0); ERROR / CANCELLED carry no training signal. With
    ``overlong_filter`` a cut session (``overlong``) is left out too: its 0 says it ran out of room, not that
    it was wrong (DAPO's overlong filtering), so it is neither trained on nor in the group's baseline."""
    out = [r for r in group if r.status in (SessionStatus.DONE, SessionStatus.TIMEOUT) and r.reward is not None]
    if overlong_filter:
        kept = [r for r in out if not overlong(r)]
        if stats is not None:
            stats["sessions_overlong_filtered"] += len(out) - len(kept)
        out = kept
    return out


def has_signal(group: list[SessionResult], overlong_filter: bool = False) -> bool:
    """Whether ``group`` can teach the group-relative surrogate: two or more usable sessions whose rewards
    differ (what dynamic sampling keeps drawing for)."""
    rewards = {float(r.reward) for r in _usable(group, overlong_filter)}  # type: ignore[arg-type]
    return len(rewards) > 1


def _count_sessions(group: list[SessionResult], stats: defaultdict[str, float]) -> None:
    stats["sessions"] += len(group)
    stats["sessions_error"] += sum(r.status == SessionStatus.ERROR for r in group)
    stats["sessions_timeout"] += sum(r.status == SessionStatus.TIMEOUT for r in group)


def _stale(usable: list[SessionResult], current_version: int, max_off_policy_steps: int) -> bool:
    """True when a sample of the group was sampled more than ``max_off_policy_steps`` versions ago."""
    oldest = min((s.metadata.get("min_policy_version", 0) for r in usable for s in r.samples), default=current_version)
    return current_version - oldest > max_off_policy_steps


def _fresh_groups(groups: Groups, current_version: int, max_off_policy_steps: int, overlong_filter: bool,
                  stats: defaultdict[str, float]) -> Iterator[list[SessionResult]]:
    """Each group's usable sessions, counted into ``stats``; a stale group is counted and left out (the filter
    ``group_batch`` and ``return_batch`` share)."""
    for group in groups:
        usable = _usable(group, overlong_filter, stats)
        _count_sessions(group, stats)
        if _stale(usable, current_version, max_off_policy_steps):
            stats["groups_stale"] += 1
            continue
        yield usable


def _trainable(r: SessionResult) -> list[TrajectorySample]:
    """The samples of ``r`` with a trained token (a sample whose loss mask is all 0 carries no gradient)."""
    return [s for s in r.samples if any(s.loss_mask)]


def group_batch(groups: Groups, current_version: int, max_off_policy_steps: int, advantage: str,
                step: StepAdvantageConfig | None = None, best: float | None = None, keep_tied: bool = False,
                overlong_filter: bool = False
                ) -> tuple[list[TrajectorySample], list[float | list[float]], dict[str, float]]:
    """Trainable samples with their advantages, plus counts. Without ``step`` a sample's advantage is its
    session's (one float, shared by its samples); with it (GiGPO) each sample gets one advantage per token:
    the session's plus ``step.weight`` x the step advantage of the turn whose call sampled the token.

    A group whose rewards (and turns) all tie teaches the surrogate nothing and is dropped, unless
    ``keep_tied`` (``kl_coef > 0``) and it tied below ``best`` (the best session reward the run has seen):
    then its samples stay at advantage 0, so the KL to the reference still applies to them
    (``groups_tied_kept``). Without that, a policy that has collapsed onto one worse behaviour ties every
    group, and the penalty meant to hold it near the reference never acts. A group tied *at* ``best``
    (every session reached the best outcome seen; ``groups_tied_at_best``) is dropped all the same: the
    policy is where training is taking it, and a step that is the KL alone (Adam scales even a small
    gradient to a full step) pulls it back toward the reference; on FrozenLake one such step took held-out
    success from 177/200 to 88/200."""
    samples: list[TrajectorySample] = []
    advs: list[float | list[float]] = []
    stats: defaultdict[str, float] = defaultdict(float)
    for usable in _fresh_groups(groups, current_version, max_off_policy_steps, overlong_filter, stats):
        if len(usable) < 2:
            stats["groups_too_small"] += 1
            continue
        adv = group_advantages(torch.tensor([r.reward for r in usable]), advantage)
        by_call = _turn_advantages(usable, step, stats) if step is not None else None
        if float(adv.abs().max()) == 0.0 and not (by_call and any(v for c in by_call for v in c.values())):
            stats["groups_no_signal"] += 1
            if best is not None and usable[0].reward >= best:  # type: ignore[operator]
                stats["groups_tied_at_best"] += 1
                continue
            if not keep_tied:
                continue
            stats["groups_tied_kept"] += 1
            by_call = None  # every advantage is 0: one float a sample
        else:
            stats["groups_used"] += 1
        for i, (r, a) in enumerate(zip(usable, adv.tolist(), strict=True)):
            for s in _trainable(r):
                samples.append(s)
                if by_call is None:
                    advs.append(a)
                else:
                    calls = by_call[i]
                    advs.append([a + calls.get(c, 0.0) if m else 0.0 for c, m in zip(s.call_indices, s.loss_mask,
                                                                                    strict=True)])
    # the share of groups whose rewards differ (GRPO learns only from those): low means most of the step's
    # sessions taught nothing; a larger group, partial-credit rewards or an SFT warm-up help
    stats["groups"] = len(groups)
    stats["groups_signal_share"] = stats["groups_used"] / max(1, len(groups))
    if "step_advantage_abs_sum" in stats:  # the mean |step advantage| over the step's turns (before weight)
        stats["step_advantage_abs_mean"] = stats.pop("step_advantage_abs_sum") / max(1.0, stats["turns"])
    return samples, advs, dict(stats)


def reward_range(groups: Groups, seen: tuple[float, float] | None) -> tuple[float, float] | None:
    """The lowest and highest reward of any usable session so far: ``seen`` widened by this step's ``groups``
    (None while neither has one)."""
    rewards = [float(r.reward) for group in groups for r in _usable(group)]  # type: ignore[arg-type]
    if seen is not None:
        rewards.extend(seen)
    return (min(rewards), max(rewards)) if rewards else None


def best_reward(seen: tuple[float, float] | None) -> float | None:
    """The best reward seen, once some session has done worse (``group_batch``'s ``best``). Before that every
    reward so far is the same: a tie at it is a policy that has not found a better outcome yet, not one that
    has converged on the best."""
    return seen[1] if seen is not None and seen[0] < seen[1] else None


def _turn_advantages(usable: list[SessionResult], step: StepAdvantageConfig, stats: defaultdict[str, float]
                     ) -> list[dict[int, float]]:
    """Per session, ``{call index: weight x step advantage of its turn}`` from the turns the session reported
    (``verifier_output["turns"]``: anchor state, ``[first, end)`` call indices, step reward). A session
    without turns (a timeout, an agent program) gets none, and its tokens keep the episode advantage."""
    turns = [r.verifier_output.get("turns") or [] for r in usable]
    stats["sessions_without_turns"] += sum(not t for t in turns)
    step_adv = step_advantages([[(str(t["state"]), float(t["reward"])) for t in ts] for ts in turns],
                               step.gamma, step.normalize)
    out: list[dict[int, float]] = []
    for ts, row in zip(turns, step_adv, strict=True):
        out.append({c: step.weight * a for t, a in zip(ts, row, strict=True) for c in range(*t["calls"])})
        stats["step_advantage_abs_sum"] += sum(abs(a) for a in row)
        stats["turns"] += len(row)
    return out


def return_batch(groups: Groups, current_version: int, max_off_policy_steps: int, overlong_filter: bool = False
                 ) -> tuple[list[TrajectorySample], list[float], dict[str, float]]:
    """``advantage: value_head``: trainable samples with their session's return (its reward; the learner's
    value head supplies the baseline), plus counts. No group baseline, so a group of one counts and a group
    whose rewards are all equal still teaches (the critic, and the policy where V differs from the return);
    only ERROR / CANCELLED sessions and stale groups are dropped."""
    samples: list[TrajectorySample] = []
    returns: list[float] = []
    stats: defaultdict[str, float] = defaultdict(float)
    for usable in _fresh_groups(groups, current_version, max_off_policy_steps, overlong_filter, stats):
        stats["groups_used"] += bool(usable)
        for r in usable:
            assert r.reward is not None
            for s in _trainable(r):
                samples.append(s)
                returns.append(float(r.reward))
    return samples, returns, dict(stats)


LOGIT_BYTES = 32  # per logit at the learner's peak: fp32 logits, log-softmax and grads (the OOM-killed run: ~37)


def memory_budget_bytes(device: torch.device) -> float:
    """What one micro-batch's logits may take: 60% of the memory free now on ``device`` (host RAM on CPU)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return 0.6 * float(free)
    import psutil

    return 0.6 * float(psutil.virtual_memory().available)


def step_advantages(episodes: list[list[tuple[str, float]]], gamma: float = 0.95, normalize: str = "std",
                    eps: float = 1e-6) -> list[list[float]]:
    """GiGPO's step-level advantages for one group (Feng et al., 2025). ``episodes[i]`` is session i's turns in
    order, each ``(anchor state, step reward)``. Each turn's return-to-go is ``G_t = r_t + gamma * G_{t+1}``;
    the turns that acted from the same anchor state, across the group's episodes and within one, form a step
    group, and a turn's advantage is its ``G`` against that group: ``(G - mean) / (std + eps)`` with
    ``normalize == "std"``, ``G - mean`` with ``"none"``. A state no other turn shares gives 0 (nothing to
    compare), as does a step group whose returns are equal."""
    if normalize not in ("std", "none"):
        raise ValueError(f"unknown step advantage normalization {normalize!r}; use 'std' or 'none'")
    returns: list[list[float]] = []
    by_state: defaultdict[str, list[float]] = defaultdict(list)
    for turns in episodes:
        g, out = 0.0, [0.0] * len(turns)
        for t in range(len(turns) - 1, -1, -1):
            g = turns[t][1] + gamma * g
            out[t] = g
        returns.append(out)
        for (state, _), g_t in zip(turns, out, strict=True):
            by_state[state].append(g_t)
    stats: dict[str, tuple[float, float]] = {}
    for state, gs in by_state.items():
        t = torch.tensor(gs, dtype=torch.float64)
        stats[state] = (float(t.mean()), float(t.std(unbiased=False)))
    advs: list[list[float]] = []
    for turns, gs in zip(episodes, returns, strict=True):
        row = []
        for (state, _), g_t in zip(turns, gs, strict=True):
            mean, std = stats[state]
            if std <= 1e-12:  # visited once, or every visit returned the same
                row.append(0.0)
            else:
                row.append((g_t - mean) / (std + eps) if normalize == "std" else g_t - mean)
        advs.append(row)
    return advs


def advantage_tensor(advantages: list[float | list[float]], width: int) -> torch.Tensor:
    """``[B]`` when every sample has one advantage, else ``[B, width]``: per-token rows (aligned with the
    sample's ``token_ids``, as ``step_advantage`` gives them) right-padded with 0 like the batch, and a
    single advantage spread over its row."""
    if all(isinstance(a, float | int) for a in advantages):
        return torch.tensor(advantages, dtype=torch.float32)
    out = torch.zeros((len(advantages), width), dtype=torch.float32)
    for i, a in enumerate(advantages):
        if isinstance(a, float | int):
            out[i] = float(a)
        else:
            out[i, :len(a)] = torch.tensor(a, dtype=torch.float32)
    return out


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
    aggregation: str = "token_mean",
) -> GRPOLossOutput:
    """Clipped surrogate + KL, summed over masked tokens and divided by ``normalizer``.

    Shapes: ``[B, T]`` for the per-token tensors; ``advantages`` is ``[B]`` (one per sequence) or
    ``[B, T]``. ``normalizer`` is what the *whole* mini-batch is divided by, so gradient accumulation over
    micro-batches gives exactly the full-batch gradient: with ``aggregation``

    - ``token_mean`` (default): its masked tokens (defaults to this mask's sum);
    - ``dr_grpo``: its sequences (defaults to ``B``): each sequence's token sum counts whole, so a long
      answer is not down-weighted per token (Dr.GRPO's "no length normalisation");
    - ``gspo``: its sequences; the ratio is per sequence, ``exp(mean over its tokens of (lp - old_lp))``
      (GSPO, Zheng et al., 2025), clipped like PPO's with the sequence's advantage; the KL term is each
      sequence's token mean. ``advantages`` must be ``[B]``; ``tis_cap`` does not apply.

    ``tis_cap``: truncated importance sampling for the rollout/learner mismatch (the engine's logprobs
    are not exactly the learner's, e.g. bf16 against fp32): each token's loss is multiplied by the
    constant weight ``min(exp(learner_lp - rollout_lp), tis_cap)``, with ``learner_lp`` the learner's
    logprob without grad. ``None`` leaves the loss as it is.
    """
    mask = mask.to(logprobs.dtype)
    if aggregation == "gspo":
        return _gspo_loss(logprobs, old_logprobs, advantages, mask, clip_range, clip_range_high, ref_logprobs,
                          kl_coef, normalizer)
    if aggregation not in ("token_mean", "dr_grpo"):
        raise ValueError(f"unknown loss aggregation {aggregation!r}; use 'token_mean', 'dr_grpo' or 'gspo'")
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    if normalizer is not None:
        n = float(normalizer)
    else:
        n = float(mask.sum().clamp(min=1.0)) if aggregation == "token_mean" else float(max(1, mask.shape[0]))
    surrogate, ratio = clipped_surrogate((logprobs - old_logprobs) * mask, advantages, clip_range, clip_range_high)
    per_token = surrogate
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
        pol = (surrogate * mask).sum().item() / n
        gap = (logprobs.detach() - old_logprobs).abs()[m]
        gap_mean = gap.mean().item() if m.any() else 0.0
        gap_max = gap.max().item() if m.any() else 0.0
        tis_mean = tis_w[m].mean().item() if tis_w is not None and m.any() else 1.0
    return GRPOLossOutput(loss, pol, float(kl_val.detach()), clip_frac, ratio_mean, gap_mean, gap_max, tis_mean)


def _gspo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
               clip_range: float, clip_range_high: float | None, ref_logprobs: torch.Tensor | None, kl_coef: float,
               normalizer: float | None) -> GRPOLossOutput:
    """``grpo_loss`` with ``aggregation="gspo"``: one clipped ratio per sequence (rows without a masked token
    count for nothing)."""
    if advantages.dim() != 1:
        raise ValueError("loss_aggregation gspo takes one advantage per sequence ([B]), not one per token")
    lengths = mask.sum(dim=1)
    has = lengths > 0
    n = float(normalizer) if normalizer is not None else float(max(1, int(has.sum())))
    seq_log_ratio = ((logprobs - old_logprobs) * mask).sum(dim=1) / lengths.clamp(min=1.0)
    surrogate, ratio = clipped_surrogate(seq_log_ratio, advantages.to(logprobs.dtype), clip_range, clip_range_high)
    per_seq = surrogate
    kl_val = torch.zeros((), dtype=logprobs.dtype)
    if ref_logprobs is not None and kl_coef > 0:
        d = (ref_logprobs - logprobs) * mask
        kl_seq = ((torch.exp(d) - d - 1.0) * mask).sum(dim=1) / lengths.clamp(min=1.0)
        per_seq = per_seq + kl_coef * kl_seq
        kl_val = (kl_seq * has).sum() / n
    loss = (per_seq * has).sum() / n
    with torch.no_grad():
        m = mask.bool()
        any_seq = bool(has.any())
        clip_frac = ((ratio - 1.0).abs() > clip_range).float()[has].mean().item() if any_seq else 0.0
        ratio_mean = ratio[has].mean().item() if any_seq else 1.0
        pol = (surrogate * has).sum().item() / n
        gap = (logprobs.detach() - old_logprobs).abs()[m]
        gap_mean = gap.mean().item() if m.any() else 0.0
        gap_max = gap.max().item() if m.any() else 0.0
    return GRPOLossOutput(loss, pol, float(kl_val.detach()), clip_frac, ratio_mean, gap_mean, gap_max, 1.0)


class TokenPolicy(Protocol):
    """What the GRPO and SFT learners need of an LLM policy (``polar.models.llm_policy.LLMPolicy`` is one)."""

    model: Any
    lora: Any
    device: torch.device

    def parameters(self) -> list[torch.nn.Parameter]: ...

    def collate(self, samples: list[TrajectorySample]) -> Any: ...

    def logits(self, batch: Any, model: Any = None) -> torch.Tensor: ...

    def logits_and_hidden(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]: ...

    def token_logprobs(self, batch: Any, model: Any = None) -> torch.Tensor: ...

    def base_token_logprobs(self, batch: Any) -> torch.Tensor: ...

    def logit_positions(self, samples: list[TrajectorySample]) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def serving_state_dict(self) -> dict[str, Any]: ...


@dataclass
class CriticTargets:
    """What the value head's update needs per sample (one entry per sample, one value per turn): the values
    before the update, the returns and the advantages; ``features`` (the turns' hidden states, in sample
    order) only when the LLM is frozen, so the head trains on them without another forward pass."""

    old_values: list[torch.Tensor]
    returns: list[torch.Tensor]
    advantages: list[torch.Tensor]
    n_turns: int
    features: torch.Tensor | None = None

    def of(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(old values, returns, advantages) of the samples ``idx``, concatenated in that order."""
        return (torch.cat([self.old_values[i] for i in idx]), torch.cat([self.returns[i] for i in idx]),
                torch.cat([self.advantages[i] for i in idx]))


class GRPOLearner:
    """GRPO's learner (``polar.types.Learner[Groups]``): policy + optimizer + (optional) reference for the KL
    term. ``update(batch)`` turns the step's session groups into samples and advantages (``group_batch``) and
    runs ``optimize`` on them; ``optimize`` alone is the optimizer step on samples (tests, benchmarks).

    The reference exists only when ``kl_coef > 0``: with LoRA it is the policy's own base weights with
    the adapters switched off (``reference_kind == "adapters_off"``, no extra memory); a full fine-tune
    keeps one frozen copy of the starting model (``"frozen_copy"``, in ``self.reference``).

    ``advantage: value_head`` adds the critic (``polar.algorithms.llm_critic``): a ``ValueHead`` over the
    LLM's last hidden state, in its own optimizer group at ``value_head.learning_rate``. ``update`` then takes
    each sample's return instead of an advantage: a no-grad pass values every turn, the advantages are the
    returns minus those values, and each micro-batch's loss adds ``vf_coef`` x the value loss to the same
    clipped policy loss (the value gradient reaches the trained LLM weights too: one trunk). With
    ``value_head.freeze_llm`` only the head trains, on the hidden states of that first pass."""

    def __init__(self, policy: TokenPolicy, kwargs: GRPOKwargs) -> None:
        self.policy = policy
        self.kw = kwargs
        self.reward_range: tuple[float, float] | None = None  # of any usable session so far (best_reward)
        self.reward_means: list[float] = []  # per step of this process (the run's summary: first and last)
        self._low_signal_steps = 0
        assert kwargs.learning_rate is not None  # GRPOKwargs fills it in at validation (LoRA or full rate)
        self.critic = kwargs.value_head if kwargs.advantage == "value_head" else None
        self.value_head: ValueHead | None = None
        groups: list[dict[str, Any]] = []
        if self.critic is None or not self.critic.freeze_llm:
            groups.append({"params": policy.parameters(), "lr": kwargs.learning_rate})
        if self.critic is not None:
            if self.critic.freeze_llm:
                for p in policy.model.parameters():
                    p.requires_grad_(False)
            self.value_head = ValueHead(int(policy.model.config.hidden_size), self.critic.hidden_units).to(policy.device)
            groups.append({"params": list(self.value_head.parameters()), "lr": self.critic.learning_rate})
        self.params = [p for g in groups for p in g["params"]]
        self._split_logged = False
        self.optimizer = torch.optim.AdamW(groups, lr=kwargs.learning_rate, weight_decay=0.0)
        # data-parallel learners (polar.distributed.data_parallel): averages the gradient over the group before
        # each optimizer step, weighted by what each learner's loss divided by; None = one learner
        self.grad_sync: Callable[[Sequence[torch.nn.Parameter], float], float] | None = None
        self.reference: Any = None
        self.reference_kind = "none"
        if kwargs.kl_coef > 0 and policy.lora is not None:
            self.reference_kind = "adapters_off"
        elif kwargs.kl_coef > 0:
            import copy

            self.reference = copy.deepcopy(policy.model).eval()
            for p in self.reference.parameters():
                p.requires_grad_(False)
            self.reference_kind = "frozen_copy"

    def reference_logprobs(self, batch: Any) -> torch.Tensor | None:
        """Per-token logprobs of the reference over ``batch`` (no grad), or None without a KL term."""
        if self.reference_kind == "none":
            return None
        if self.reference_kind == "adapters_off":
            return self.policy.base_token_logprobs(batch)
        with torch.no_grad():
            return self.policy.token_logprobs(batch, self.reference)

    def turn_values(self, hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(V per turn, the turns' hidden states) of one batch, in ``state_positions``' order."""
        assert self.value_head is not None
        rows, cols = state_positions(mask)
        features = hidden[rows, cols].float()
        return self.value_head(features), features

    def critic_targets(self, samples: list[TrajectorySample], returns: list[float]) -> CriticTargets:
        """Values of every turn before the update (no grad, micro-batch by micro-batch), each turn's return
        (its sample's) and advantage."""
        assert self.critic is not None
        pol, mb = self.policy, self.kw.micro_batch_size
        values: list[torch.Tensor] = []
        feats: list[torch.Tensor] = []
        counts: list[int] = []
        with torch.no_grad():
            for start in range(0, len(samples), mb):
                batch = pol.collate(samples[start:start + mb])
                _, hidden = pol.logits_and_hidden(batch)
                v, f = self.turn_values(hidden, batch.loss_mask)
                values.append(v)
                feats.append(f)
                counts.extend(turns_per_row(batch.loss_mask))
        flat_v = torch.cat(values)
        flat_r = torch.cat([torch.full((n,), float(r), device=flat_v.device) for n, r in zip(counts, returns, strict=True)])
        flat_a = value_advantages(flat_r, flat_v, self.critic.normalize_advantage)
        cut = [sum(counts[:i]) for i in range(len(counts) + 1)]

        def split(t: torch.Tensor) -> list[torch.Tensor]:
            return [t[cut[i]:cut[i + 1]] for i in range(len(counts))]

        return CriticTargets(split(flat_v), split(flat_r), split(flat_a), len(flat_v),
                             torch.cat(feats) if self.critic.freeze_llm else None)

    # ------------------------------------------------------------------ the Learner
    def update(self, batch: Batch[Groups]) -> Metrics:
        """One GRPO step on ``batch.data``'s groups; ``batch.version`` (the policy version the step starts from)
        decides which groups are stale, ``batch.iteration`` names the step in the logs."""
        kw = self.kw
        t_learn = time.monotonic()
        if batch.iteration == 1 and self.reference is not None:
            # the reference is the policy GRPO starts from: after an SFT warm-up stage, its weights
            self.reference.load_state_dict(self.policy.model.state_dict())
        upd: dict[str, float]
        if kw.advantage == "value_head":  # the critic gives the baseline: each sample's return
            samples, returns, counts = return_batch(batch.data, batch.version, kw.max_off_policy_steps,
                                                    kw.overlong_filter)
            upd = self.optimize(samples, returns=returns) if samples or self.grad_sync is not None else {}
        else:
            self.reward_range = reward_range(batch.data, self.reward_range)
            # Dr.GRPO drops the std as well as the length normalisation
            method = "mean" if kw.loss_aggregation == "dr_grpo" and kw.advantage == "mean_std" else kw.advantage
            samples, advs, counts = group_batch(batch.data, batch.version, kw.max_off_policy_steps, method,
                                                kw.step_advantage, best=best_reward(self.reward_range),
                                                keep_tied=kw.kl_coef > 0, overlong_filter=kw.overlong_filter)
            upd = self.optimize(samples, advs) if samples or self.grad_sync is not None else {}
        # value_head.freeze_llm trains the head only: the served policy is unchanged, so nothing is published
        frozen = kw.value_head is not None and kw.value_head.freeze_llm
        stepped = upd.get("optimizer_steps", 0) > 0  # a learner group's rank may step on its peers' gradient
        if not samples and not stepped:  # a step with no usable group changed no weight: no swap, no new version
            log.info("GRPO step %d: no usable group (%s); the weights and policy version stay", batch.iteration,
                     ", ".join(f"{k} {v:g}" for k, v in counts.items() if k.startswith("groups_")))
        self.warn_on_low_signal(counts, batch.iteration)
        stats: Metrics = dict(upd)
        if "policy_loss" in stats:
            stats["pg_loss"] = stats.pop("policy_loss")
        rewards = batch.episode_returns
        reward_mean = sum(rewards) / max(1, len(rewards))
        self.reward_means.append(reward_mean)
        # ``step`` and ``reward_mean``: the names the tools that read agent runs know
        return {"step": batch.iteration, "samples": len(samples), "update_skipped": int(not stepped or frozen),
                "reward_mean": reward_mean, "learn_s": round(time.monotonic() - t_learn, 3), **counts, **stats}

    def warn_on_low_signal(self, counts: Mapping[str, float], step: int) -> None:
        """Say so when most groups carry no signal (GRPO learns only from groups whose rewards differ), with
        what helps; once at the first such step, then every 10th, so a long run's log stays readable. Groups
        tied at the best reward seen are left out: every session there did as well as any has, which is
        convergence, not a missing signal."""
        open_groups = counts.get("groups", 0) - counts.get("groups_tied_at_best", 0)
        share = counts.get("groups_used", 0) / open_groups if open_groups > 0 else 1.0
        if share >= LOW_SIGNAL_SHARE:
            return
        self._low_signal_steps += 1
        if self._low_signal_steps % 10 != 1:
            return
        log.warning("GRPO step %d: only %.0f%% of the groups carry a signal (rewards differ within the group; "
                    "the rest teach nothing). What helps: a larger group (policy.kwargs.group_size, now %d), "
                    "partial-credit rewards from the verifier, easier tasks or a curriculum, or an SFT warm-up "
                    "(sft_warmup) on demonstrations", step, 100 * share, self.kw.group_size)

    def weights(self) -> Mapping[str, Any]:
        """What the engine serves: the policy's weights (LoRA merged)."""
        return self.policy.serving_state_dict()

    def optimize(self, samples: list[TrajectorySample], advantages: list[float | list[float]] | None = None,
                 returns: list[float] | None = None) -> dict[str, float]:
        """``epochs_per_step`` passes over ``samples`` (one advantage each, or one per token with
        ``step_advantage``; with the value head, one return each instead), each pass one optimizer step per
        mini-batch (``num_minibatches`` shuffled slices), with gradient accumulation over
        ``micro_batch_size`` sequences and token-level normalization over the mini-batch. Later mini-batches
        of a step are slightly off-policy; the clipped ratio against the rollout's logprobs bounds them, as
        in PPO."""
        kw = self.kw
        pol = self.policy
        pol.model.train()
        if not samples:
            return self._zero_weight_steps()
        targets: CriticTargets | None = None
        if self.critic is not None:
            if returns is None:
                raise ValueError("advantage: value_head: optimize() takes each sample's return (returns=)")
            targets = self.critic_targets(samples, returns)
            if self.critic.freeze_llm:
                return self._fit_head(targets)
        elif advantages is None:
            raise ValueError(f"advantage: {kw.advantage}: optimize() takes each sample's advantage")
        stats: defaultdict[str, float] = defaultdict(float)
        n_batch_tokens = float(sum(sum(s.loss_mask[1:]) for s in samples)) or 1.0
        order = list(range(len(samples)))
        # in a learner group every rank takes the same number of optimizer steps (each is one all-reduce), so a
        # shard smaller than num_minibatches has empty mini-batches there, which take part with weight 0
        n_mini = kw.num_minibatches if self.grad_sync is not None else max(1, min(kw.num_minibatches, len(samples)))
        steps = float(kw.epochs_per_step * n_mini)  # the sums below are means over the optimizer steps
        grad_norm = 0.0
        taken = 0
        for _ in range(kw.epochs_per_step):
            random.shuffle(order)
            for m in range(n_mini):
                minibatch = order[m * len(order) // n_mini:(m + 1) * len(order) // n_mini]
                n_tokens = float(sum(sum(samples[i].loss_mask[1:]) for i in minibatch)) or 1.0
                # what the mini-batch's loss is divided by: its tokens (token_mean) or its sequences
                norm = n_tokens if kw.loss_aggregation == "token_mean" else float(
                    sum(any(samples[i].loss_mask[1:]) for i in minibatch) or 1)
                self.optimizer.zero_grad(set_to_none=True)
                for idx in self.micro_batches(minibatch, samples, stats, full_logits=targets is not None):
                    batch = pol.collate([samples[i] for i in idx])
                    value_loss = None
                    if targets is None:
                        assert advantages is not None
                        adv = advantage_tensor([advantages[i] for i in idx], batch.loss_mask.shape[1]).to(pol.device)
                        logp = pol.token_logprobs(batch)
                    else:
                        assert self.critic is not None
                        logits, hidden = pol.logits_and_hidden(batch)
                        logp = token_logprobs(logits, batch.token_ids)
                        old_v, ret, turn_adv = targets.of(idx)
                        adv = per_token(turn_adv, batch.loss_mask)
                        v, _ = self.turn_values(hidden, batch.loss_mask)
                        if v.numel():  # the mean over this micro-batch's turns, weighted to its mini-batch's share
                            mini_turns = sum(targets.old_values[i].numel() for i in minibatch)
                            value_loss = ppo_value_loss(v, old_v, ret, self.critic.clip_range_vf) * (v.numel() / mini_turns)
                    ref = self.reference_logprobs(batch)
                    out = grpo_loss(logp, batch.old_logprobs, adv, batch.loss_mask, kw.clip_range, kw.clip_range_high,
                                    ref, kw.kl_coef, normalizer=norm, tis_cap=kw.tis_cap,
                                    aggregation=kw.loss_aggregation)
                    loss = out.loss
                    if value_loss is not None and self.critic is not None:
                        loss = loss + self.critic.vf_coef * value_loss
                        stats["value_loss"] += float(value_loss.detach())
                    loss.backward()
                    w = float(batch.loss_mask.sum()) / n_tokens
                    stats["policy_loss"] += out.policy_loss
                    stats["kl"] += out.kl
                    stats["clip_fraction"] += out.clip_fraction * w
                    stats["ratio_mean"] += out.ratio_mean * w
                    stats["logprob_gap_mean"] += out.logprob_gap_mean * w
                    stats["logprob_gap_max"] = max(stats["logprob_gap_max"], out.logprob_gap_max * steps)
                    stats["tis_weight_mean"] += out.tis_weight_mean * w
                if self.grad_sync is not None:  # data-parallel: weighted by what this shard's loss divided by
                    if self.grad_sync(self.params, norm if minibatch else 0.0) <= 0:
                        continue  # no rank had data in this mini-batch: no step anywhere
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, kw.max_grad_norm))
                self.optimizer.step()
                taken += 1
        out_stats = {k: v / steps for k, v in stats.items() if k != "micro_batches_split"}
        out_stats |= {"grad_norm": grad_norm, "trained_tokens": n_batch_tokens, "optimizer_steps": float(taken)}
        if "micro_batches_split" in stats:
            out_stats["micro_batches_split"] = stats["micro_batches_split"]
        return out_stats | (self._critic_stats(targets) if targets is not None else {})

    def _zero_weight_steps(self) -> dict[str, float]:
        """A learner group's rank whose shard has no usable sample: it joins each of the step's all-reduces with
        weight 0 and applies the group's mean gradient like its peers, so their collectives complete (instead of
        waiting until ``learner_timeout_s`` and restarting the group) and its weights stay theirs. One learner,
        or ``value_head.freeze_llm`` (no collective): nothing to do."""
        frozen = self.critic is not None and self.critic.freeze_llm
        if self.grad_sync is None or frozen:
            return {}
        taken, grad_norm = 0, 0.0
        for _ in range(self.kw.epochs_per_step * self.kw.num_minibatches):
            self.optimizer.zero_grad(set_to_none=True)
            if self.grad_sync(self.params, 0.0) <= 0:
                continue
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.kw.max_grad_norm))
            self.optimizer.step()
            taken += 1
        return {"grad_norm": grad_norm, "optimizer_steps": float(taken)}

    def micro_batches(self, order: list[int], samples: list[TrajectorySample], stats: defaultdict[str, float],
                      full_logits: bool = False) -> list[list[int]]:
        """``order`` in runs of ``micro_batch_size``, each split in halves until its logits fit in memory. The
        learner holds the logits and several copies of them (log-softmax, their grads): ``[B, T, vocab]`` fp32
        when it needs them at every position (``full_logits``: the value head's pass, a policy without
        ``logits_to_keep``), else one row per trained token. A micro-batch of long episodes can need more
        than the machine has (8 x 1,300 tokens x SmolLM2's 49,152 ids at every position was OOM-killed at
        19 GB); the loss is normalized over the mini-batch, so a split changes the memory, not the gradient."""
        vocab = int(getattr(self.policy.model.config, "vocab_size", 0) or 0)
        budget = memory_budget_bytes(self.policy.device)

        def positions(idx: list[int]) -> int:
            if full_logits:
                return len(idx) * max(len(samples[i].token_ids) for i in idx)
            return self.policy.logit_positions([samples[i] for i in idx])

        out: list[list[int]] = []
        pending = [order[i:i + self.kw.micro_batch_size] for i in range(0, len(order), self.kw.micro_batch_size)]
        while pending:
            idx = pending.pop(0)
            need = positions(idx) * vocab * LOGIT_BYTES
            if len(idx) > 1 and need > budget:
                half = len(idx) // 2
                pending[:0] = [idx[:half], idx[half:]]
                if not self._split_logged:
                    self._split_logged = True
                    log.info("a micro-batch of %d sequences would hold ~%.1f GiB of logits, more than the %.1f GiB "
                             "this learner allows itself; splitting it (same gradient, smaller passes)",
                             len(idx), need / 2**30, budget / 2**30)
                stats["micro_batches_split"] += 1
                continue
            out.append(idx)
        return out

    def _fit_head(self, targets: CriticTargets) -> dict[str, float]:
        """``value_head.freeze_llm``: ``epochs_per_step`` steps of the head alone on the turns' hidden states."""
        assert self.value_head is not None and self.critic is not None and targets.features is not None
        old_v, ret, _ = targets.of(list(range(len(targets.returns))))
        value_loss = 0.0
        grad_norm = 0.0
        for _ in range(self.kw.epochs_per_step if targets.n_turns else 0):
            self.optimizer.zero_grad(set_to_none=True)
            loss = ppo_value_loss(self.value_head(targets.features), old_v, ret, self.critic.clip_range_vf)
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.kw.max_grad_norm))
            self.optimizer.step()
            value_loss += float(loss.detach())
        return {"value_loss": value_loss / self.kw.epochs_per_step, "grad_norm": grad_norm,
                **self._critic_stats(targets)}

    @staticmethod
    def _critic_stats(targets: CriticTargets) -> dict[str, float]:
        """PPO's critic diagnostics over the step's turns, from the values before the update."""
        v, r, _ = targets.of(list(range(len(targets.returns))))
        return {"explained_variance": explained_variance(v, r), "value_mean": float(v.mean()) if v.numel() else 0.0,
                "return_mean": float(r.mean()) if r.numel() else 0.0, "turns": float(targets.n_turns)}

    def state_dict(self) -> dict[str, Any]:
        """The policy (``model``), the optimizer, the value head, the reward range seen so far, and a full
        fine-tune's frozen reference: it is the policy the first GRPO step started from (after an SFT warm-up,
        not the base model), which a resumed run cannot rebuild from the config."""
        state: dict[str, Any] = {"model": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                                 "reward_range": list(self.reward_range) if self.reward_range else None}
        if self.value_head is not None:
            state["value_head"] = self.value_head.state_dict()
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "model" in state:
            self.policy.load_state_dict(dict(state["model"]))
        seen = state.get("reward_range")  # None in checkpoints from before it was kept
        if self.reference is not None and "reference" in state:  # absent before it was kept: the base stays
            self.reference.load_state_dict(dict(state["reference"]))
        self.reward_range = (float(seen[0]), float(seen[1])) if seen else None
        if "optimizer" not in state:  # an optimizer-free checkpoint: the weights only
            return
        if self.value_head is not None:
            if "value_head" not in state:
                raise ConfigError("the checkpoint has no value head (its run used a group baseline); resume with "
                                  "the advantage it was trained with, or start a new run for advantage: value_head")
            self.value_head.load_state_dict(state["value_head"])
        elif "value_head" in state:
            raise ConfigError("the checkpoint holds a value head (its run used advantage: value_head); resume with "
                              "policy.kwargs.advantage: value_head and the same value_head settings")
        self.optimizer.load_state_dict(state["optimizer"])
