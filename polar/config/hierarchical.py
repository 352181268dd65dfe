"""Hierarchical agents (``policy: {type: hierarchical, kwargs: {...}}``): a manager that picks a skill (an option)
every ``option_steps`` env steps or when the skill ends, and skills that act in the env. docs/hierarchy.md.

Both levels are PPO: ``ppo`` holds the settings of the manager and of every trained skill (the same keys as
``policy.kwargs`` of a flat PPO run, so a flat baseline copies them); ``manager_ppo`` overrides the manager's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from polar.config.base import StrictModel
from polar.config.ppo import PPOKwargs


class SkillConfig(StrictModel):
    """One skill: a sub-policy over the env's own actions.

    - ``subgoal``: the skill ends when the env's step ``info`` says ``subgoal_<subgoal>`` holds (or after
      ``option_steps``, or at the episode's end); None: it ends only on those two.
    - ``reward``: what the skill trains on. ``subgoal``: ``subgoal_reward`` when its subgoal comes to hold while it
      runs, 0 otherwise (intrinsic); ``extrinsic``: the env's reward over the steps it ran.
    - ``checkpoint``: start from these weights: a run directory or a ``ckpt_*.pt`` of a flat PPO run on the same
      env (its ``policy``) or of a hierarchical run (its skill of the same name).
    - ``train``: false keeps the skill frozen (it then needs ``checkpoint``).
    - ``requires``: subgoals (of other skills) that must hold for the manager to pick this skill, with
      ``initiation_sets`` (the door skill of key-door requires the key)."""

    name: str = Field(min_length=1)
    subgoal: str | None = None
    reward: Literal["subgoal", "extrinsic"] = "subgoal"
    checkpoint: str | None = None
    train: bool = True
    requires: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> SkillConfig:
        if self.reward == "subgoal" and self.subgoal is None:
            raise ValueError(f"skill {self.name!r}: reward 'subgoal' needs a subgoal (the info key "
                             "subgoal_<name> that ends it); name one, or set reward: extrinsic")
        if not self.train and self.checkpoint is None:
            raise ValueError(f"skill {self.name!r}: train: false freezes the skill, so it needs a checkpoint to "
                             "load; give checkpoint: RUN_DIR, or set train: true")
        return self


class HierarchicalKwargs(StrictModel):
    option_steps: int = Field(8, ge=1, description="k: the manager picks again after k env steps of one skill, or "
                              "sooner when the skill's subgoal holds or the episode ends")
    subgoal_reward: float = Field(1.0, description="a 'subgoal' skill's reward for reaching its subgoal")
    initiation_sets: bool = Field(True, description="a skill whose subgoal already holds cannot be picked (the "
                                  "option's initiation set): the manager's observation carries an action_mask over "
                                  "the skills; false: any skill, any time")
    skills: list[SkillConfig] = Field(min_length=1)
    ppo: PPOKwargs = Field(default_factory=PPOKwargs, description="PPO settings of the manager and every trained "
                           "skill; n_steps (or rollout_samples) sets the env steps collected per iteration")
    manager_ppo: PPOKwargs | None = Field(None, description="the manager's own PPO settings (default: ppo)")

    @model_validator(mode="after")
    def _unique_names(self) -> HierarchicalKwargs:
        names = [s.name for s in self.skills]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"skills: the name {dup[0]!r} is used twice; give each skill its own name")
        subgoals = {s.subgoal for s in self.skills if s.subgoal is not None}
        for i, s in enumerate(self.skills):
            unknown = [r for r in s.requires if r not in subgoals]
            if unknown:
                raise ValueError(f"skills[{i}].requires: {unknown[0]!r} is no skill's subgoal (subgoals: "
                                 f"{', '.join(sorted(subgoals)) or 'none'}); name one of them")
            if s.requires and not self.initiation_sets:
                raise ValueError(f"skills[{i}].requires: needs initiation_sets: true (it restricts where the "
                                 "manager may pick the skill)")
        for kw, key in ((self.ppo, "ppo"), (self.manager_ppo, "manager_ppo")):
            if kw is not None and (kw.normalize_obs or kw.normalize_reward):
                raise ValueError(f"{key}.normalize_obs / normalize_reward: not supported in hierarchical runs "
                                 "(manager and skills act on raw observations and rewards); set them to false")
        return self

    @property
    def manager(self) -> PPOKwargs:
        return self.manager_ppo or self.ppo

    def steps_per_env(self, num_envs: int) -> int:
        """Env steps per env copy in one iteration's batch (``ppo.n_steps``, or ``ppo.rollout_samples`` split)."""
        return self.ppo.steps_per_env(num_envs)


class HierarchicalPolicyConfig(StrictModel):
    type: Literal["hierarchical"] = "hierarchical"
    kwargs: HierarchicalKwargs
