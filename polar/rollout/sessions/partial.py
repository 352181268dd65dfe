"""Partial rollouts' supply of session groups (``policy.kwargs.partial_rollouts``; AReaL, Kimi k1.5, PipelineRL).

Groups are submitted one by one and run on across weight updates; a step takes the first of them that finish,
oldest first. How many may be submitted but not yet trained on follows AReaL's bound: ``(K + 1) x
tasks_per_step`` (``max_groups_in_flight``) minus what the step being collected already took, topped up when
a new version is published. A group submitted under version ``v`` then has at most ``(K + 1) x
tasks_per_step - 1`` groups ahead of it, so when groups finish in the order they started it is taken by the
step that trains version ``v + K`` at the latest. Groups that finish out of order can fall further behind:
``stale`` says when a group's oldest token is more than K versions old, and such a group is dropped.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from polar.types import SessionResult

Group = list[SessionResult]
GroupRequest = tuple[dict[str, Any], int, dict[str, Any]]


@dataclass(frozen=True)
class PartialRollouts:
    """``max_staleness``: K, the most versions a trained token may be behind; ``max_groups_in_flight``: groups
    submitted and not yet trained on, at most."""

    max_staleness: int
    max_groups_in_flight: int


def oldest_version(group: Group) -> int | None:
    """The oldest policy version of any token the group's sessions sampled (None: no session sampled one)."""
    versions = [int(s.metadata["min_policy_version"]) for r in group for s in r.samples
                if "min_policy_version" in s.metadata]
    return min(versions) if versions else None


def spans_update(r: SessionResult) -> bool:
    """Whether the session's sampled tokens came from more than one policy version."""
    return len({v for s in r.samples for v, m in zip(s.policy_versions, s.loss_mask, strict=False) if m}) > 1


def stale(group: Group, version: int, max_staleness: int) -> bool:
    """True when a token of the group was sampled more than ``max_staleness`` versions before ``version``."""
    oldest = oldest_version(group)
    return oldest is not None and version - oldest > max_staleness


class GroupStream:
    """Groups under way, each on its own worker thread (``run_group`` blocks until its sessions end), in the
    order they were submitted. ``untrained`` counts the groups submitted and not yet taken (running, or
    finished and waiting)."""

    def __init__(self, run_group: Callable[[GroupRequest], Group], max_groups_in_flight: int) -> None:
        self.run_group = run_group
        self.capacity = max_groups_in_flight
        self._pool = concurrent.futures.ThreadPoolExecutor(max_groups_in_flight, thread_name_prefix="polar-partial")
        # (its sessions, the version it was submitted under, when)
        self._queue: list[tuple[concurrent.futures.Future[Group], int, float]] = []
        self.last_submitted_at = 0.0  # when the group ``take`` returned last was submitted

    @property
    def untrained(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return sum(not f.done() for f, _, _ in self._queue)

    def submit(self, request: GroupRequest, version: int) -> None:
        self._queue.append((self._pool.submit(self.run_group, request), version, time.monotonic()))

    def take(self, timeout_s: float) -> Group | None:
        """The oldest finished group (waiting up to ``timeout_s`` for one); None when none finished in time."""
        if not self._queue:
            raise RuntimeError("partial rollouts: no group is under way to take (nothing was submitted)")
        finished = [i for i, (f, _, _) in enumerate(self._queue) if f.done()]
        if not finished:
            concurrent.futures.wait([f for f, _, _ in self._queue], timeout=timeout_s,
                                    return_when=concurrent.futures.FIRST_COMPLETED)
            finished = [i for i, (f, _, _) in enumerate(self._queue) if f.done()]
            if not finished:
                return None
        future, _, self.last_submitted_at = self._queue.pop(finished[0])
        return future.result()

    def close(self) -> None:
        """Cancel the groups not started; the ones under way end within their sessions' budget."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._queue.clear()
