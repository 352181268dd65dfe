"""Hierarchical agents as options (Sutton, Precup & Singh 1999): a manager picks a skill; the skill acts until it
ends; the manager picks again. Both levels train with the unchanged ``PPOLearner``.

Credit assignment (docs/hierarchy.md):

- **Manager: SMDP returns.** One manager step is one option: it starts at s_t, lasts tau env steps, and its
  reward is the option's discounted extrinsic return ``R = sum_{i<tau} gamma^i r_{t+i}`` (``option_return``).
  Its successor is the next decision, tau env steps later, discounted by ``gamma ** tau``: GAE runs over
  decisions with per-step discounts (``polar.algorithms.advantages.rollout_gae`` reads the fragment's
  ``durations``), so ``delta = R + gamma^tau V(s_{t+tau}) - V(s_t)``.
- **Skills: their own reward.** Each option execution is an episode of its skill: it ends *terminated* when the
  skill's subgoal comes to hold (reward ``subgoal_reward``) or the env episode ends, *truncated* (bootstrapped
  from the skill's value) when ``option_steps`` run out or the env truncates. A skill with ``reward: extrinsic``
  trains on the env's reward over its steps instead.

This module is the pure part (the return, the record the collector hands over) and the learner that sends each
part of a batch to its own ``PPOLearner``; the acting and the packing of decisions into fragments are the
collector's (``polar.rollout.options``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from polar.types import Batch, Metrics, Rollout


def option_return(rewards: Sequence[float], gamma: float) -> float:
    """An option's SMDP reward: the discounted sum of the env rewards it collected, ``sum_i gamma^i r_i``."""
    total, discount = 0.0, 1.0
    for r in rewards:
        total += discount * float(r)
        discount *= gamma
    return total


@dataclass(frozen=True)
class OptionRollout:
    """One iteration's batch of a hierarchical run: the manager's completed decisions (a ``Rollout`` whose
    fragment carries ``durations``) and each skill's steps (skills that did not act are absent); ``stats`` are the
    collector's counts (option lengths, how often each skill was picked)."""

    manager: Rollout | None
    skills: dict[str, Rollout] = field(default_factory=dict)
    stats: Metrics = field(default_factory=dict)


class RolloutLearner(Protocol):
    """A PPO learner as this one uses it (``polar.algorithms.ppo.PPOLearner``)."""

    def update(self, batch: Batch[Rollout], /) -> Metrics: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class HierarchicalLearner:
    """The manager's and each trained skill's ``PPOLearner``, each updated on its own part of the batch. A frozen
    skill (``train: false``) has no learner, so its weights never change. Metrics: ``manager/<stat>`` and
    ``skill/<name>/<stat>`` for the learners' stats, plus the collector's ``options/...`` counts."""

    def __init__(self, manager: RolloutLearner, skills: Mapping[str, RolloutLearner | None]) -> None:
        self.manager = manager
        self.skills = dict(skills)

    def _part(self, rollout: Rollout, batch: Batch[OptionRollout]) -> Batch[Rollout]:
        steps = sum(f.env_steps for f in rollout.fragments)
        return Batch(rollout, steps, run_env_steps=batch.run_env_steps, iteration=batch.iteration,
                     version=batch.version)

    def update(self, batch: Batch[OptionRollout], /) -> Metrics:
        data = batch.data
        stats: Metrics = dict(data.stats)
        if data.manager is not None:
            stats.update({f"manager/{k}": v for k, v in self.manager.update(self._part(data.manager, batch)).items()})
        for name, rollout in data.skills.items():
            learner = self.skills.get(name)
            if learner is not None:
                stats.update({f"skill/{name}/{k}": v for k, v in learner.update(self._part(rollout, batch)).items()})
        if data.manager is None and not any(self.skills.get(n) is not None for n in data.skills):
            stats["update_skipped"] = 1
        return stats

    def state_dict(self) -> dict[str, Any]:
        return {"manager": self.manager.state_dict(),
                "skills": {n: lr.state_dict() for n, lr in self.skills.items() if lr is not None}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.manager.load_state_dict(state["manager"])
        for n, lr in self.skills.items():
            if lr is not None:
                lr.load_state_dict(state["skills"][n])


__all__ = ["HierarchicalLearner", "OptionRollout", "RolloutLearner", "option_return"]
