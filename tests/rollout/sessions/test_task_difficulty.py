"""The per-task pass-rate estimate of ``difficulty_filter``: its moving average (``ema``), its band (``low``,
``high``) and the chance to draw a task outside it anyway (``explore_share``)."""

import random

from polar.config.grpo import DifficultyFilterConfig
from polar.rollout.sessions.session import SessionResult, SessionStatus
from polar.rollout.sessions.task_sampling import TaskDifficulty


def _group(task_id: str, rewards: list[float]) -> list[SessionResult]:
    return [SessionResult(f"s{i}", f"{task_id}-submission", None, i, SessionStatus.DONE, reward=r,
                          metadata={"dataset_task_id": task_id}) for i, r in enumerate(rewards)]


def test_estimate_is_a_moving_average_of_group_success_with_weight_ema():
    d = TaskDifficulty(DifficultyFilterConfig(ema=0.25))
    d.observe([_group("a", [1.0, 1.0, 0.0, 0.0])])
    assert d.estimates == {"a": 0.5}  # the first group sets it
    d.observe([_group("a", [1.0, 1.0, 1.0, 1.0])])
    assert d.estimates["a"] == 0.75 * 0.5 + 0.25 * 1.0
    # an ERROR session says nothing about the task; a group of only errors leaves the estimate as it was
    d.observe([[SessionResult("e", "a-x", None, 0, SessionStatus.ERROR, metadata={"dataset_task_id": "a"})]])
    assert d.groups_seen == {"a": 2}


def test_band_admits_unseen_and_in_band_tasks_and_explores_the_rest_at_explore_share():
    d = TaskDifficulty(DifficultyFilterConfig(low=0.2, high=0.8, explore_share=0.3))
    d.observe([_group("easy", [1.0, 1.0]), _group("mid", [1.0, 0.0]), _group("hard", [0.0, 0.0])])
    rng = random.Random(0)
    assert d.admit("unseen", rng) and d.admit("mid", rng)
    draws = [d.admit("easy", rng) for _ in range(2000)] + [d.admit("hard", rng) for _ in range(2000)]
    assert 0.27 < sum(draws) / len(draws) < 0.33
    assert d.metrics()["difficulty/tasks_in_band"] == 1.0
