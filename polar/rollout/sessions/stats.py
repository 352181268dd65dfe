"""What a batch of agent sessions did, in session words: held-out success (``success_rate``), why sessions gave no training data (``polar
generate``'s summary), how often the model called a tool, timed out or was fully masked (the per-step
metrics of agent runs), and how far a collection in progress has come (the progress lines of both)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from polar.types import SessionResult, SessionStatus

# in the order a summary lists them
DROP_REASONS = ("timeout", "fully_masked", "verifier_error", "harness_error", "cancelled", "below_min_reward")
DROP_HELP = {
    "timeout": "the session ran past harness.timeout_s (or sessions.session_budget_s)",
    "fully_masked": "no call left complete token data (a client that hung up and retried, an upstream "
                    "without ids): nothing to train on",
    "verifier_error": "the verifier raised or timed out (verifier.timeout_s)",
    "harness_error": "the agent failed (non-zero exit, exception)",
    "cancelled": "cancelled before it finished",
    "below_min_reward": "verified, below the reward asked for",
}


def drop_reason(r: SessionResult, min_reward: float | None = None) -> str | None:
    """Why ``r`` gives no accepted training data (one of ``DROP_REASONS``), or None when it does."""
    if r.status is SessionStatus.CANCELLED:
        return "cancelled"
    if r.status is SessionStatus.ERROR:
        return "verifier_error" if (r.error or "").startswith("verifier") else "harness_error"
    if r.status is SessionStatus.TIMEOUT:
        return "timeout"
    if r.status is not SessionStatus.DONE:
        return "cancelled"  # not finished: only a stopped collection leaves one
    if not r.trainable:
        return "fully_masked"
    if min_reward is not None and (r.reward is None or r.reward < min_reward):
        return "below_min_reward"
    return None


@dataclass
class DropSummary:
    """Per reason: how many sessions, and the first one's error (what to look at first)."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {reason: {"sessions": n, **({"example": self.examples[reason]} if reason in self.examples else {})}
                for reason, n in self.counts.items()}


def summarize_drops(results: Iterable[SessionResult], min_reward: float | None = None) -> DropSummary:
    out = DropSummary()
    for r in results:
        reason = drop_reason(r, min_reward)
        if reason is None:
            continue
        out.counts[reason] = out.counts.get(reason, 0) + 1
        if r.error and reason not in out.examples:
            out.examples[reason] = r.error.strip().splitlines()[-1][:300]
    out.counts = {k: out.counts[k] for k in DROP_REASONS if k in out.counts}
    return out


def session_metrics(results: list[SessionResult]) -> dict[str, float]:
    """Per-step rates of an agent run (``metrics.jsonl``, TensorBoard): the share of model calls that called a
    tool, and the shares of sessions that timed out, were fully masked (finished with nothing to train on)
    or failed."""
    n = max(1, len(results))
    calls = sum(int(r.builder_stats.get("calls_total", 0)) for r in results)
    tool_calls = sum(int(r.builder_stats.get("calls_with_tool_calls", 0)) for r in results)
    reasons = [drop_reason(r) for r in results]
    return {
        "sessions/tool_call_rate": round(tool_calls / calls, 4) if calls else 0.0,
        "sessions/timeout_rate": round(reasons.count("timeout") / n, 4),
        "sessions/masked_rate": round(reasons.count("fully_masked") / n, 4),
        "sessions/error_rate": round((reasons.count("verifier_error") + reasons.count("harness_error")) / n, 4),
    }


@dataclass
class LiveCounts:
    """A collection in progress: sessions submitted and finished, by status, and the finished ones' rewards."""

    sessions: int = 0
    finished: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    rewards: list[float] = field(default_factory=list)

    @property
    def reward_mean(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None


def live_counts(stack: Any, match: Callable[[dict[str, Any]], bool], timeout_s: float = 5.0) -> LiveCounts | None:
    """Count, on the rollout service's own loop, the sessions of the tasks whose metadata ``match``es (None
    when ``stack`` has no rollout service or it did not answer in ``timeout_s``)."""
    rollout = getattr(stack, "rollout", None)
    service = getattr(rollout, "service", None)
    if rollout is None or service is None:
        return None

    async def snapshot() -> LiveCounts:
        out = LiveCounts()
        for state in list(service.tasks.values()):
            if not match(state.metadata):
                continue
            out.sessions += state.num_samples
            out.finished += len(state.results)
            for r in state.results:
                out.statuses[r.status.value] = out.statuses.get(r.status.value, 0) + 1
                if r.reward is not None:
                    out.rewards.append(float(r.reward))
        return out

    try:
        counts: LiveCounts = rollout.call(snapshot(), timeout_s)
    except Exception:  # a progress line is never worth failing the collection for
        return None
    return counts


def session_success(r: SessionResult) -> float:
    """One session's success: the verifier's own ``success`` verdict when it gives one (an LLM env agent's
    "reached the goal", which a shaped return does not show), else its reward; 0 for ERROR and TIMEOUT."""
    if r.status != SessionStatus.DONE or r.reward is None:
        return 0.0
    verdict = r.verifier_output.get("success")
    return float(verdict) if isinstance(verdict, bool) else float(r.reward)


def success_rate(groups: list[list[SessionResult]]) -> dict[str, float]:
    """Held-out success over all sessions (``session_success``; ERROR sessions count as failures), next to the
    mean reward, which differs from it when the reward is shaped."""
    results = [r for g in groups for r in g]
    rewards = [r.reward if r.status == SessionStatus.DONE and r.reward is not None else 0.0 for r in results]
    return {"success": sum(map(session_success, results)) / max(1, len(results)),
            "reward_mean": sum(rewards) / max(1, len(rewards)), "sessions": len(results),
            "errors": sum(r.status == SessionStatus.ERROR for r in results)}
