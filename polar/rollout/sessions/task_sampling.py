"""Which tasks a GRPO step draws: online difficulty filtering (``policy.kwargs.difficulty_filter``) and
curricula whose levels advance (``tasks: {source: reasoning_gym, curriculum: {...}, advance: {...}}``).

A group whose sessions all pass or all fail has no signal (its advantages are all 0), so a task the policy
always solves, or never does, costs a step's sessions and teaches nothing. ``TaskDifficulty`` keeps a
pass-rate estimate per task id (an exponential moving average of its groups' success) and admits a task when
its turn comes if the estimate lies in ``[low, high]`` or the task was never drawn; one outside the band is
admitted with probability ``explore_share``, so its estimate follows the policy as it learns. Its state goes
into the session collector's share of the checkpoint, so a resumed run keeps what it learned about the tasks.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from polar.config.grpo import DifficultyFilterConfig
from polar.config.llm_agent import ReasoningGymTasks
from polar.rollout.sessions.stats import session_success
from polar.types import SessionResult, SessionStatus


class TaskDifficulty:
    """Per-task pass-rate estimates and the band that admits a task (see the module docstring)."""

    def __init__(self, cfg: DifficultyFilterConfig) -> None:
        self.cfg = cfg
        self.estimates: dict[str, float] = {}
        self.groups_seen: dict[str, int] = {}
        self.skipped = 0  # tasks passed over since the last ``metrics()``

    def observe(self, groups: list[list[SessionResult]]) -> None:
        """Fold each group's success (its DONE / TIMEOUT sessions; ERROR ones say nothing of the task) into its
        task's estimate."""
        for group in groups:
            scored = [r for r in group if r.status in (SessionStatus.DONE, SessionStatus.TIMEOUT)]
            if not scored:
                continue
            # the task's own id (the collector's metadata); a result's task_id is the submission's, one per group
            task_id = str(scored[0].metadata.get("dataset_task_id") or scored[0].task_id)
            rate = sum(map(session_success, scored)) / len(scored)
            old = self.estimates.get(task_id)
            self.estimates[task_id] = rate if old is None else (1.0 - self.cfg.ema) * old + self.cfg.ema * rate
            self.groups_seen[task_id] = self.groups_seen.get(task_id, 0) + 1

    def in_band(self, task_id: str) -> bool:
        p = self.estimates.get(task_id)
        return p is None or self.cfg.low <= p <= self.cfg.high

    def admit(self, task_id: str, rng: random.Random) -> bool:
        """Whether the task whose turn it is gets drawn (False: passed over until the next pass over the tasks)."""
        if self.in_band(task_id) or rng.random() < self.cfg.explore_share:
            return True
        self.skipped += 1
        return False

    def metrics(self) -> dict[str, float]:
        """The estimates' summary for the step's row; resets the skipped count."""
        inside = sum(self.cfg.low <= p <= self.cfg.high for p in self.estimates.values())
        out = {"difficulty/tasks_seen": float(len(self.estimates)), "difficulty/tasks_in_band": float(inside),
               "difficulty/tasks_skipped": float(self.skipped)}
        self.skipped = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"estimates": dict(self.estimates), "groups_seen": dict(self.groups_seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.estimates = {str(k): float(v) for k, v in state.get("estimates", {}).items()}
        self.groups_seen = {str(k): int(v) for k, v in state.get("groups_seen", {}).items()}


class Curriculum:
    """A reasoning-gym curriculum that advances: the training tasks are generated at ``levels``; when the mean
    success of the last ``advance.window_groups`` groups reaches ``advance.threshold``, every attribute below
    its top level goes up one and the tasks are generated again (same seeds, new levels; ids carry the
    advance count, ``chain_sum-3@2``, so per-task estimates never mix levels). The levels are checkpointed."""

    def __init__(self, spec: ReasoningGymTasks) -> None:
        assert spec.advance is not None and spec.curriculum
        self.spec = spec
        self.advance = spec.advance
        self.levels: dict[str, int] = dict(spec.curriculum)
        self.advances = 0
        self._recent: deque[float] = deque(maxlen=spec.advance.window_groups)

    def tasks(self) -> list[dict[str, Any]]:
        from polar.harness.benchmarks import reasoning_gym

        out = reasoning_gym.tasks(self.spec.model_copy(update={"curriculum": dict(self.levels)}))
        if self.advances:
            for t in out:
                t["id"] = f"{t['id']}@{self.advances}"
        return out

    def _top(self) -> dict[str, int]:
        from polar.harness.benchmarks import reasoning_gym

        curriculum = reasoning_gym._rg().create_curriculum(self.spec.name)
        return {a: len(curriculum.attributes[a].levels) - 1 for a in self.levels}

    def observe(self, groups: list[list[SessionResult]]) -> list[dict[str, Any]] | None:
        """Fold the groups' success in; the new tasks when the levels advanced, else None."""
        for group in groups:
            scored = [r for r in group if r.status in (SessionStatus.DONE, SessionStatus.TIMEOUT)]
            if scored:
                self._recent.append(sum(map(session_success, scored)) / len(scored))
        if len(self._recent) < self._recent.maxlen or sum(self._recent) / len(self._recent) < self.advance.threshold:  # type: ignore[operator]
            return None
        top = self._top()
        raised = {a: min(top[a], lvl + 1) for a, lvl in self.levels.items()}
        if raised == self.levels:
            return None  # every attribute is at its top level
        self.levels, self.advances = raised, self.advances + 1
        self._recent.clear()  # the new level's pass rate starts from its own groups
        return self.tasks()

    def metrics(self) -> dict[str, float]:
        return {"curriculum/advances": float(self.advances),
                **{f"curriculum/{a}": float(lvl) for a, lvl in self.levels.items()}}

    def state_dict(self) -> dict[str, Any]:
        return {"levels": dict(self.levels), "advances": self.advances}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.levels = {str(k): int(v) for k, v in state["levels"].items()}
        self.advances = int(state.get("advances", 0))
