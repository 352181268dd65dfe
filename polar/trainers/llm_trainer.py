"""Session groups -> what the GRPO learner trains on (``group_batch``; ``return_batch`` with the value head),
and the held-out success measure.

The GRPO step itself (one optimizer step per iteration) runs in ``polar.trainers.agent``, through the one
loop; its update is ``polar.algorithms.grpo.GRPOLearner``.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from polar.algorithms.grpo import group_advantages, step_advantages
from polar.config.grpo import StepAdvantageConfig
from polar.rollout.sessions.session import SessionResult, SessionStatus
from polar.types import TrajectorySample

Groups = list[list[SessionResult]]


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
    for group in groups:
        usable = _usable(group, overlong_filter, stats)
        _count_sessions(group, stats)
        if _stale(usable, current_version, max_off_policy_steps):
            stats["groups_stale"] += 1
            continue
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
            for s in r.samples:
                if any(s.loss_mask):
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
    for group in groups:
        usable = _usable(group, overlong_filter, stats)
        _count_sessions(group, stats)
        if _stale(usable, current_version, max_off_policy_steps):
            stats["groups_stale"] += 1
            continue
        stats["groups_used"] += bool(usable)
        for r in usable:
            assert r.reward is not None
            for s in r.samples:
                if any(s.loss_mask):
                    samples.append(s)
                    returns.append(float(r.reward))
    return samples, returns, dict(stats)


def session_success(r: SessionResult) -> float:
    """One session's success: the verifier's own ``success`` verdict when it gives one (an LLM env agent's
    "reached the goal", which a shaped return does not show), else its reward; 0 for ERROR and TIMEOUT."""
    if r.status != SessionStatus.DONE or r.reward is None:
        return 0.0
    verdict = r.verifier_output.get("success")
    return float(verdict) if isinstance(verdict, bool) else float(r.reward)


def success_rate(groups: Groups) -> dict[str, float]:
    """Held-out success over all sessions (``session_success``; ERROR sessions count as failures), next to the
    mean reward, which differs from it when the reward is shaped."""
    results = [r for g in groups for r in g]
    rewards = [r.reward if r.status == SessionStatus.DONE and r.reward is not None else 0.0 for r in results]
    return {"success": sum(map(session_success, results)) / max(1, len(results)),
            "reward_mean": sum(rewards) / max(1, len(rewards)), "sessions": len(results),
            "errors": sum(r.status == SessionStatus.ERROR for r in results)}
