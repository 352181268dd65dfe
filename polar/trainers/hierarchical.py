"""Hierarchical runs (``policy.type: hierarchical``): the one training loop composed of the option collector
(``polar.rollout.options``), a learner holding a manager and its skills, and an evaluator that plays whole
episodes with both levels. docs/hierarchy.md.

The registry row hands in ``make_learner`` (the manager's and the trained skills' ``PPOLearner``s, wrapped in
``HierarchicalLearner``), so this module names no algorithm. The checkpoint holds ``policies`` (the manager's
and every skill's weights), ``learner`` (their optimizers) and the collector's ``options`` (which skill each env
copy runs, and for how long).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from polar.config.hierarchical import HierarchicalKwargs, SkillConfig
from polar.config.run import EnvRunConfig
from polar.errors import ConfigError
from polar.harness import make_vector_env
from polar.models.policy import Policy, build_policy
from polar.rollout.backends.collector import harness_name
from polar.rollout.episodes import ForkedTorchGenerator
from polar.rollout.options import OptionCollector, Skill, manager_observation_space, play_option_episodes
from polar.trainers.checkpoint import CheckpointManager, load_checkpoint
from polar.trainers.env_run import AlgorithmLearner
from polar.trainers.loop import OnIteration, TrainingLoop, env_steps_budget
from polar.trainers.observe import RunLogs
from polar.trainers.run_dir import RunDir
from polar.types import Batch, Metrics, Progress

log = logging.getLogger(__name__)

#: ``(manager agent, {skill: agent, or None when frozen}, kwargs, total_env_steps) -> learner``
MakeLearner = Callable[[torch.nn.Module, dict[str, torch.nn.Module | None], HierarchicalKwargs, int],
                       AlgorithmLearner[Any]]


def hierarchical_kwargs(cfg: EnvRunConfig) -> HierarchicalKwargs:
    kw = cfg.policy.kwargs
    if not isinstance(kw, HierarchicalKwargs):
        raise ConfigError(f"policy.type {cfg.policy.type!r} is not a hierarchical run")
    return kw


def check_hierarchical_config(cfg: EnvRunConfig) -> HierarchicalKwargs:
    """What a hierarchical run cannot do, refused at start with the key to change."""
    kw = hierarchical_kwargs(cfg)
    if cfg.distribution.backend != "local" or cfg.distribution.rollout_workers != 0:
        raise ConfigError("distribution: policy.type hierarchical steps its envs in the learner process; set "
                          "backend: local and rollout_workers: 0")
    if cfg.distribution.num_learners > 1:
        raise ConfigError("distribution.num_learners: policy.type hierarchical trains with one learner; set it to 1")
    if cfg.harness.type not in ("gymnasium", "custom"):
        raise ConfigError(f"harness.type {cfg.harness.type!r}: policy.type hierarchical runs on single-agent env "
                          "harnesses (gymnasium, custom)")
    return kw


def _spaces(cfg: EnvRunConfig) -> tuple[gym.Space[Any], gym.Space[Any]]:
    probe = make_vector_env(cfg.harness, 1, seed=cfg.seed, config_dir=cfg.config_dir)
    try:
        return probe.single_observation_space, probe.single_action_space
    finally:
        probe.close()


def build_policies(cfg: EnvRunConfig, obs_space: gym.Space[Any], act_space: gym.Space[Any]
                   ) -> tuple[Policy, dict[str, Policy]]:
    """The manager (its actions: one per skill) and one policy per skill, all ``cfg.agent``, feed-forward."""
    kw = hierarchical_kwargs(cfg)
    manager_space = manager_observation_space(obs_space, len(kw.skills), kw.initiation_sets)
    manager = build_policy(cfg, manager_space, gym.spaces.Discrete(len(kw.skills)), cfg.config_dir)
    skills = {s.name: build_policy(cfg, obs_space, act_space, cfg.config_dir) for s in kw.skills}
    if manager.agent.get_initial_state(1) is not None:
        raise ConfigError(f"agent.type {getattr(cfg.agent, 'type', None)!r}: policy.type hierarchical runs "
                          "feed-forward agents (mlp, cnn, or a custom agent without internal state)")
    return manager, skills


def _skill_checkpoint(skill: SkillConfig, where: str, config_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The weights ``skill.checkpoint`` names: a flat run's ``policy``, or a hierarchical run's skill of the
    same name; a path that does not exist, or a run without checkpoints, is an error naming the key."""
    assert skill.checkpoint is not None
    path = Path(skill.checkpoint).expanduser()
    if not path.is_absolute():
        path = config_dir / path
    if not path.exists():
        raise ConfigError(f"{where}.checkpoint: {path} does not exist; give a run directory or a ckpt_*.pt file of "
                          "a run on the same env")
    if path.is_dir():
        ckpt_dir = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        latest = CheckpointManager(ckpt_dir).latest()
        if latest is None:
            raise ConfigError(f"{where}.checkpoint: {path} holds no checkpoint (no ckpt_*.pt); give a run "
                              "directory that has one, or a checkpoint file")
        path = latest
    state = load_checkpoint(path)
    policies = state.get("policies")
    if isinstance(policies, Mapping):
        weights = policies.get("skills", {}).get(skill.name)
        if weights is None:
            raise ConfigError(f"{where}.checkpoint: {path} is a hierarchical run without a skill named "
                              f"{skill.name!r} (its skills: {', '.join(policies.get('skills', {}))})")
        return path, weights
    if "policy" not in state:
        raise ConfigError(f"{where}.checkpoint: {path} holds no policy weights; give a checkpoint of an env run")
    return path, state["policy"]


def load_skill(policy: Policy, skill: SkillConfig, where: str, config_dir: Path) -> None:
    """Load a skill's checkpoint into ``policy``; weights that do not fit (another env's spaces) are an error."""
    path, weights = _skill_checkpoint(skill, where, config_dir)
    own = policy.state_dict()
    missing = [k for k in own if k not in weights]
    extra = [k for k in weights if k not in own]
    if missing or extra:
        raise ConfigError(f"{where}.checkpoint: {path} holds another network ({'no ' + missing[0] if missing else 'an extra ' + extra[0]}); "
                          "use a checkpoint of a run with the same agent section")
    for k, v in own.items():
        theirs = weights[k]
        if tuple(theirs.shape) != tuple(v.shape):
            raise ConfigError(f"{where}.checkpoint: {path} does not fit this skill: {k} has shape "
                              f"{tuple(theirs.shape)}, this env's skill needs {tuple(v.shape)} (its observation or "
                              "action space differs from this env's); use a checkpoint of a run on the same env")
    policy.load_state_dict(weights)
    log.info("skill %r starts from %s%s", skill.name, path, "" if skill.train else " (frozen)")


class HierarchyLearner:
    """The run's ``Learner``: the algorithm's learner plus the policies it trains (all in this process, so
    ``weights`` are ``{}``: the collector acts with these very objects)."""

    def __init__(self, manager: Policy, skills: dict[str, Policy], algorithm: AlgorithmLearner[Any]) -> None:
        self.manager = manager
        self.skills = skills
        self.algorithm = algorithm

    def update(self, batch: Batch[Any]) -> Metrics:
        return self.algorithm.update(batch)

    def weights(self) -> Mapping[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"policies": {"manager": self.manager.state_dict(),
                             "skills": {n: p.state_dict() for n, p in self.skills.items()}},
                "learner": self.algorithm.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_policies(self.manager, self.skills, state)
        self.algorithm.load_state_dict(state["learner"])


def load_policies(manager: Policy, skills: dict[str, Policy], state: Mapping[str, Any]) -> None:
    policies = state.get("policies")
    if not isinstance(policies, Mapping):
        raise ConfigError("the checkpoint holds no 'policies' (manager and skills); it was not written by a "
                          "hierarchical run")
    manager.load_state_dict(policies["manager"])
    for n, p in skills.items():
        if n not in policies["skills"]:
            raise ConfigError(f"the checkpoint has no skill named {n!r} (its skills: "
                              f"{', '.join(policies['skills'])}); the config's skills changed since it was written")
        p.load_state_dict(policies["skills"][n])


def option_collector(cfg: EnvRunConfig, manager: Policy, skills: dict[str, Policy], num_envs: int,
                     seed: int | None, record: bool) -> OptionCollector:
    kw = hierarchical_kwargs(cfg)
    env = make_vector_env(cfg.harness, num_envs, seed=seed, config_dir=cfg.config_dir)
    specs = [Skill(s.name, skills[s.name], s.subgoal, s.reward, f"policy.kwargs.skills[{i}]", tuple(s.requires))
             for i, s in enumerate(kw.skills)]
    return OptionCollector(env, manager, specs, kw.option_steps, kw.manager.gamma, kw.subgoal_reward,
                           kw.steps_per_env(num_envs), seed, harness_name(cfg.harness), kw.initiation_sets,
                           record=record)


def evaluate_options(cfg: EnvRunConfig, manager: Policy, skills: dict[str, Policy], episodes: int, seed: int,
                     deterministic: bool) -> dict[str, Any]:
    """Whole episodes with both levels acting, on env copies of their own (``eval.num_envs``)."""
    for p in (manager, *skills.values()):
        p.eval()
    n = max(1, min(cfg.eval.num_envs, episodes))
    collector = option_collector(cfg, manager, skills, n, seed, record=False)
    try:
        with torch.inference_mode(), nullcontext() if deterministic else ForkedTorchGenerator().active():
            res = play_option_episodes(collector, episodes, deterministic)
    finally:
        collector.close()
    res["seed"] = seed
    return res


class OptionEvaluator:
    """Every ``eval.every_n_iterations`` iterations and at the end (``eval.at_end``): ``evaluate_options``,
    written to ``eval/<tag>.json``; the row gets ``eval/success_rate`` and ``eval/return_mean``."""

    def __init__(self, cfg: EnvRunConfig, run_dir: RunDir, learner: HierarchyLearner) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.learner = learner

    def evaluate(self, tag: str, progress: Progress) -> dict[str, Any]:
        ev = self.cfg.eval
        res = evaluate_options(self.cfg, self.learner.manager, self.learner.skills, ev.episodes, ev.seed,
                               ev.deterministic)
        res.update(env_steps=progress.env_steps, iteration=progress.iteration)
        self.run_dir.write_json(f"eval/{tag}.json", res)
        return res

    def before(self, progress: Progress) -> dict[str, Any]:
        return {}

    def periodic(self, progress: Progress) -> Metrics:
        every = self.cfg.eval.every_n_iterations
        if every and progress.iteration % every == 0:
            res = self.evaluate(f"iter_{progress.iteration:08d}", progress)
            return {"eval/success_rate": res["success_rate"], "eval/return_mean": res["return_mean"]}
        return {}

    def final(self, progress: Progress) -> dict[str, Any]:
        return {"eval": self.evaluate("final", progress)} if self.cfg.eval.at_end else {}


def compose_hierarchical(cfg: EnvRunConfig, run_dir: RunDir, make_learner: MakeLearner, *, resume: bool = False,
                         on_iteration: OnIteration | None = None, extra_metrics: Metrics | None = None,
                         run_logs: RunLogs | None = None) -> TrainingLoop[Any]:
    """The loop of a hierarchical run (module docstring); resumed from the newest checkpoint when ``resume``."""
    kw = check_hierarchical_config(cfg)
    state = None
    if resume:
        ckpt, state = CheckpointManager(run_dir.checkpoints_dir, keep=cfg.logging.keep_checkpoints).load_newest()
        log.info("resuming from checkpoint %s", ckpt)
    torch.set_num_threads(1)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    obs_space, act_space = _spaces(cfg)
    manager, skills = build_policies(cfg, obs_space, act_space)
    if state is None:
        for i, s in enumerate(kw.skills):
            if s.checkpoint is not None:
                load_skill(skills[s.name], s, f"policy.kwargs.skills[{i}]", cfg.config_dir)
    for s in kw.skills:
        if not s.train:
            skills[s.name].requires_grad_(False)
    trained: dict[str, torch.nn.Module | None] = {s.name: skills[s.name].agent if s.train else None for s in kw.skills}
    learner = HierarchyLearner(manager, skills, make_learner(manager.agent, trained, kw, cfg.total_env_steps))
    seed = cfg.seed if state is None else cfg.seed + 104_729 * (int(state["iteration"]) + 1)  # fresh env seeds
    collector = option_collector(cfg, manager, skills, cfg.distribution.num_envs, seed, record=True)
    try:
        return TrainingLoop(cfg, run_dir, collector, learner, OptionEvaluator(cfg, run_dir, learner),
                            budget=env_steps_budget(cfg.total_env_steps), state=state, on_iteration=on_iteration,
                            extra_metrics=extra_metrics, run_logs=run_logs)
    except BaseException:
        collector.close()
        raise


def evaluate_hierarchical(cfg: EnvRunConfig, state: Mapping[str, Any], episodes: int | None, seed: int | None,
                          deterministic: bool) -> dict[str, Any]:
    """``polar eval`` of a hierarchical run's checkpoint ``state``: ``evaluate_options`` with its policies."""
    check_hierarchical_config(cfg)
    obs_space, act_space = _spaces(cfg)
    manager, skills = build_policies(cfg, obs_space, act_space)
    load_policies(manager, skills, state)
    ev = cfg.eval
    return evaluate_options(cfg, manager, skills, episodes or ev.episodes, ev.seed if seed is None else seed,
                            deterministic)


__all__ = ["HierarchyLearner", "MakeLearner", "OptionEvaluator", "build_policies", "check_hierarchical_config",
           "compose_hierarchical", "evaluate_hierarchical", "load_skill"]
