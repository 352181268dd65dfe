"""The rollout-worker autoscaling rule (``distribution.autoscale``): measured signals in, a count out.

``decide`` is a pure function of one interval's signals, so the rule is testable without Ray. The
``Autoscaler`` gathers the signals where they are measured (the learner's wait inside
``next_fragment``, the pool's queue depth, each fragment's policy lag) and asks ``decide`` once per
``interval_s``. An interval only counts while every worker has started, so a worker that is still
importing torch does not look like missing throughput and trigger a second scale-up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ScaleSignals:
    """What the learner measured over one interval."""

    window_s: float  # wall time the interval covered
    learner_wait_s: float  # of which the learner waited for a fragment (empty queue)
    queue_depth_mean: float  # finished fragments not yet taken by the learner, averaged over samples
    policy_lag_mean: float  # versions between a fragment's weights and the learner's, averaged
    workers: int  # rollout workers now (not counting retiring ones)
    room_for_one: bool = True  # the cluster has free resources for one more rollout actor

    @property
    def wait_fraction(self) -> float:
        return self.learner_wait_s / self.window_s if self.window_s > 0 else 0.0

    @property
    def queue_per_worker(self) -> float:
        return self.queue_depth_mean / max(1, self.workers)


def decide(s: ScaleSignals, cfg) -> tuple[int, str]:
    """``(new_worker_count, reason)``; the count equals ``s.workers`` when the rule holds.

    ``cfg`` is an ``AutoscaleConfig``; its docstring states the rule.
    """
    lo, hi = cfg.min_rollout_workers, cfg.max_rollout_workers
    wf = s.wait_fraction
    if s.workers < lo:
        return lo, f"below min_rollout_workers={lo}"
    if s.workers > hi:
        return hi, f"above max_rollout_workers={hi}"
    if wf > cfg.scale_up_wait_fraction:
        if s.workers >= hi:
            return s.workers, f"learner waited {wf:.0%} of {s.window_s:.1f} s on fragments, but already at max_rollout_workers={hi}"
        if not s.room_for_one:
            return s.workers, f"learner waited {wf:.0%} of {s.window_s:.1f} s on fragments, but the cluster has no room for another rollout actor"
        n = min(hi, s.workers + cfg.step)
        return n, (f"learner waited {wf:.0%} of {s.window_s:.1f} s on an empty fragment queue "
                   f"(> scale_up_wait_fraction {cfg.scale_up_wait_fraction:.0%})")
    if wf < cfg.scale_up_wait_fraction / 2 and s.workers > lo:
        n = max(lo, s.workers - cfg.step)
        if s.queue_per_worker >= cfg.scale_down_queue_per_worker:
            return n, (f"{s.queue_per_worker:.2f} finished fragments per worker waited for the learner "
                       f"(>= scale_down_queue_per_worker {cfg.scale_down_queue_per_worker:g}); learner waited {wf:.0%}")
        if cfg.scale_down_policy_lag is not None and s.policy_lag_mean > cfg.scale_down_policy_lag:
            return n, (f"mean policy lag {s.policy_lag_mean:.2f} > scale_down_policy_lag {cfg.scale_down_policy_lag:g}; "
                       f"learner waited {wf:.0%}")
    return s.workers, f"hold: learner waited {wf:.0%}, {s.queue_per_worker:.2f} fragments queued per worker"


class Autoscaler:
    """Accumulates one interval of signals; ``due`` says when ``decide`` should run."""

    def __init__(self, cfg, clock=time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self.enabled = True
        self.last_signals: ScaleSignals | None = None
        self.reset()

    def reset(self) -> None:
        """Start a fresh interval (after a decision, or while workers are still starting)."""
        self.window_start = self.clock()
        self.wait_s = 0.0
        self.queue_sum = 0.0
        self.queue_n = 0
        self.lag_sum = 0.0
        self.lag_n = 0

    def observe(self, wait_s: float, queue_depth: int, policy_lag: int) -> None:
        """One fragment taken: how long the learner waited for it, what was queued, how stale it was."""
        self.wait_s += wait_s
        self.queue_sum += queue_depth
        self.queue_n += 1
        self.lag_sum += policy_lag
        self.lag_n += 1

    def due(self) -> bool:
        return self.enabled and self.clock() - self.window_start >= self.cfg.interval_s

    def signals(self, workers: int, room_for_one: bool) -> ScaleSignals:
        return ScaleSignals(
            window_s=self.clock() - self.window_start,
            learner_wait_s=self.wait_s,
            queue_depth_mean=self.queue_sum / self.queue_n if self.queue_n else 0.0,
            policy_lag_mean=self.lag_sum / self.lag_n if self.lag_n else 0.0,
            workers=workers,
            room_for_one=room_for_one,
        )

    def step(self, workers: int, room_for_one: bool) -> tuple[int, str, ScaleSignals]:
        """Decide on the interval that just ended and start the next one."""
        s = self.signals(workers, room_for_one)
        self.last_signals = s
        n, reason = decide(s, self.cfg)
        self.reset()
        return n, reason, s
