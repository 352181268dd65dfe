"""Session groups -> what the GRPO learner trains on (``group_batch``; ``return_batch`` with the value head),
and the held-out success measure.

The GRPO step itself (one optimizer step per iteration) runs in ``polar.trainers.agent``, through the one
loop; its update is ``polar.algorithms.grpo.GRPOLearner``.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from polar.algorithms.grpo import group_advantages
from polar.rollout.sessions.session import SessionResult, SessionStatus
from polar.types import TrajectorySample

Groups = list[list[SessionResult]]


def _usable(group: list[SessionResult]) -> list[SessionResult]:
    """The sessions with a verdict (DONE, or TIMEOUT's 0); ERROR / CANCELLED carry no training signal."""
    return [r for r in group if r.status in (SessionStatus.DONE, SessionStatus.TIMEOUT) and r.reward is not None]


def _count_sessions(group: list[SessionResult], stats: defaultdict[str, float]) -> None:
    stats["sessions"] += len(group)
    stats["sessions_error"] += sum(r.status == SessionStatus.ERROR for r in group)
    stats["sessions_timeout"] += sum(r.status == SessionStatus.TIMEOUT for r in group)


def _stale(usable: list[SessionResult], current_version: int, max_off_policy_steps: int) -> bool:
    """True when a sample of the group was sampled more than ``max_off_policy_steps`` versions ago."""
    oldest = min((s.metadata.get("min_policy_version", 0) for r in usable for s in r.samples), default=current_version)
    return current_version - oldest > max_off_policy_steps


def group_batch(groups: Groups, current_version: int, max_off_policy_steps: int, advantage: str
                ) -> tuple[list[TrajectorySample], list[float], dict[str, float]]:
    """Trainable samples with one advantage each (per session, shared by its samples), plus counts."""
    samples: list[TrajectorySample] = []
    advs: list[float] = []
    stats: defaultdict[str, float] = defaultdict(float)
    for group in groups:
        usable = _usable(group)
        _count_sessions(group, stats)
        if _stale(usable, current_version, max_off_policy_steps):
            stats["groups_stale"] += 1
            continue
        if len(usable) < 2:
            stats["groups_too_small"] += 1
            continue
        adv = group_advantages(torch.tensor([r.reward for r in usable]), advantage)
        if float(adv.abs().max()) == 0.0:
            stats["groups_no_signal"] += 1
            continue
        stats["groups_used"] += 1
        for r, a in zip(usable, adv.tolist(), strict=True):
            for s in r.samples:
                if any(s.loss_mask):
                    samples.append(s)
                    advs.append(a)
    # the share of groups whose rewards differ (GRPO learns only from those): low means most of the step's
    # sessions taught nothing; a larger group, partial-credit rewards or an SFT warm-up help
    stats["groups_signal_share"] = stats["groups_used"] / max(1, len(groups))
    return samples, advs, dict(stats)


def return_batch(groups: Groups, current_version: int, max_off_policy_steps: int
                 ) -> tuple[list[TrajectorySample], list[float], dict[str, float]]:
    """``advantage: value_head``: trainable samples with their session's return (its reward; the learner's
    value head supplies the baseline), plus counts. No group baseline, so a group of one counts and a group
    whose rewards are all equal still teaches (the critic, and the policy where V differs from the return);
    only ERROR / CANCELLED sessions and stale groups are dropped."""
    samples: list[TrajectorySample] = []
    returns: list[float] = []
    stats: defaultdict[str, float] = defaultdict(float)
    for group in groups:
        usable = _usable(group)
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
