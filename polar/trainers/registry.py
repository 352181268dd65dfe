"""One row per algorithm: ``{policy.type: Algorithm(Kwargs, make_learner, make_collector, ...)}`` for env runs,
``{policy.type: AgentAlgorithm(Kwargs, make_parts)}`` for agent runs (GRPO, SFT). With the
config models, this is the only place that knows algorithm names; ``polar.trainers.build`` composes a row into
the one loop, for ``polar run`` and the Ray learner actor alike.

Adding an algorithm (docs/DEVELOPING.md, "Adding an algorithm"): its config (``polar/config/<algo>.py``, one line
in the ``EnvPolicyConfig`` union of ``polar/config/run.py``), its losses and learner with ``update(batch) ->
Metrics``, ``state_dict()``, ``load_state_dict()`` (``polar/algorithms/<algo>.py``), and one row here.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np
import torch
from pydantic import BaseModel

from polar.algorithms.appo import APPOLearner
from polar.algorithms.bc import BCLearner
from polar.algorithms.cql import CQLLearner, DiscreteCQLLearner
from polar.algorithms.distill import DistillLearner
from polar.algorithms.dqn import DQNLearner
from polar.algorithms.gail import (
    AIRLDiscriminator,
    Discriminator,
    GAILDiscriminator,
    GAILLearner,
    Transitions,
    check_spaces,
)
from polar.algorithms.grpo import GRPOLearner, has_signal
from polar.algorithms.hierarchical import HierarchicalLearner
from polar.algorithms.iql import IQLLearner
from polar.algorithms.mbpo import MBPOLearner
from polar.algorithms.optim import module_device
from polar.algorithms.ppo import PPOLearner
from polar.algorithms.rnd import make_intrinsic
from polar.algorithms.sac import SACLearner
from polar.algorithms.sft import SFTLearner, demonstration_batches, sft_steps
from polar.buffers.mixed import MixedReplay
from polar.buffers.nstep import NStepTransitions
from polar.buffers.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer
from polar.config.appo import APPOKwargs
from polar.config.bc import BCKwargs, OfflineKwargs
from polar.config.cql import CQLKwargs
from polar.config.distill import DistillKwargs
from polar.config.dqn import DQNKwargs
from polar.config.gail import AIRLKwargs, GAILKwargs
from polar.config.grpo import GRPOKwargs, SFTKwargs, TeacherConfig
from polar.config.hierarchical import HierarchicalKwargs
from polar.config.iql import IQLKwargs
from polar.config.llm_agent import ReasoningGymTasks
from polar.config.mbpo import MBPOKwargs
from polar.config.ppo import DEFAULT_BATCH_SIZE, PPOKwargs
from polar.config.run import AgentRunConfig, EnvRunConfig
from polar.config.sac import SACKwargs
from polar.errors import ConfigError
from polar.harness.agent.tasks import resolve
from polar.harness.sessions import load_run_tasks as load_tasks
from polar.models.off_policy import QCritic, network_settings
from polar.rollout.backends.collector import EnvCollector, FiniteGuard, harness_name
from polar.rollout.backends.replay import ReplayCollector
from polar.rollout.sessions.collector import DemonstrationCollector, SessionCollector
from polar.rollout.sessions.partial import PartialRollouts
from polar.rollout.sessions.task_sampling import Curriculum, TaskDifficulty
from polar.trainers.agentic_run import AgentAlgorithm, AgentContext, AgentEvaluator, AgentParts
from polar.trainers.continual import old_replay
from polar.trainers.env_run import AlgorithmLearner, EnvParts, PolicyLearner
from polar.trainers.learner_group import LearnerGroup, group_spec, shard_groups, shard_rollout, shard_samples
from polar.trainers.loop import Stage, TrainingLoop, iterations_budget
from polar.trainers.run_dir import RunDir
from polar.types import Collector, Learner, Rollout, SessionResult

if TYPE_CHECKING:
    from polar.models.llm_policy import LLMPolicy

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- the row type


@dataclass(frozen=True)
class Algorithm:
    """One algorithm's row.

    - ``kwargs``: its ``policy.kwargs`` model (``polar/config/<algo>.py``);
    - ``make_learner(parts)``: its ``Learner`` for the run's parts (usually ``PolicyLearner(parts, <its learner>)``);
    - ``make_collector(parts, learner)``: where its batches come from;
    - ``steps_per_env(cfg)``: env steps per env in one fragment, for the rollout backend; ``None``: the algorithm
      trains from a dataset (no backend; the env is made only to read its spaces and to evaluate);
    - ``iteration_env_steps``: an iteration (a metrics row, the unit of checkpoint and eval intervals) ends once
      this many env steps arrived (0: after every batch);
    - ``gradient_steps``: for a dataset algorithm, the run's budget in learner updates (``None``: the env run's
      ``total_env_steps``);
    - ``own_loop``: an algorithm that acts with more than one policy and steps its envs in the learner process
      (hierarchical) composes its loop and evaluates its checkpoints itself; ``make_learner`` and
      ``make_collector`` are then unused;
    - ``on_policy``: it trains only on fragments collected with its newest weights (PPO): local rollout
      workers wait for each update's weights before they collect again (``polar.rollout.backends.local``)."""

    kwargs: type[BaseModel]
    make_learner: Callable[[EnvParts], Learner[Any]] | None
    make_collector: Callable[[EnvParts, Learner[Any]], Collector[Any]] | None
    steps_per_env: Callable[[EnvRunConfig], int] | None = None
    iteration_env_steps: int = 0
    gradient_steps: Callable[[EnvRunConfig], int] | None = None
    own_loop: OwnLoop | None = None
    on_policy: bool = False


@dataclass(frozen=True)
class OwnLoop:
    """An algorithm's own composition (``polar.trainers.build`` calls it in place of the row's parts):
    ``compose(cfg, run_dir, resume=, on_iteration=, extra_metrics=, run_logs=) -> TrainingLoop`` and
    ``evaluate(cfg, checkpoint_state, episodes, seed, deterministic) -> result`` (``polar eval``)."""

    compose: Callable[..., TrainingLoop[Any]]
    evaluate: Callable[[EnvRunConfig, Mapping[str, Any], int | None, int | None, bool], dict[str, Any]]


def env_collector(parts: EnvParts, fragments: Callable[[], int], buffered: bool = False) -> EnvCollector:
    """Fragments from the run's backend, ``nonfinite`` applied, normalizer moments folded in."""
    cfg, backend = parts.cfg, parts.backend
    assert backend is not None  # rows with steps_per_env have one
    kw = cfg.policy.kwargs
    reward_norm, reward_clip = None, None
    if isinstance(kw, PPOKwargs | APPOKwargs) and kw.normalize_reward:  # the return normalizer's scale
        from polar.models.normalization import RunningNorm

        reward_norm, reward_clip = RunningNorm((), kw.clip_reward), kw.clip_reward
    return EnvCollector(backend, parts.policy, FiniteGuard(cfg.nonfinite, harness_name(cfg.harness)), fragments,
                        reward_norm=reward_norm, reward_clip=reward_clip, buffered=buffered)


def n_updates(learner: Learner[Any]) -> int:
    """A dataset algorithm's learner updates so far (its budget)."""
    algorithm = cast(PolicyLearner[Any], learner).algorithm
    return int(getattr(algorithm, "n_updates", 0))


# ---------------------------------------------------------------------- PPO, APPO
def _ppo_kw(parts: EnvParts) -> PPOKwargs:
    return cast(PPOKwargs, parts.cfg.policy.kwargs)


def ppo_learner(agent: torch.nn.Module, kw: PPOKwargs, total_env_steps: int) -> AlgorithmLearner[Rollout]:
    """PPO's learner for ``agent`` (also one per policy of a PettingZoo run, ``polar.trainers.multi_agent``)."""
    return PPOLearner(agent, kw, total_env_steps)


def _ppo_learner(parts: EnvParts) -> Learner[Any]:
    kw, total = _ppo_kw(parts), parts.cfg.total_env_steps
    d = parts.cfg.distribution  # intrinsic (RND) with num_learners > 1 is refused by the config
    algorithm: AlgorithmLearner[Rollout] = PPOLearner(
        parts.train_agent, kw, total, make_intrinsic(parts.observation_space, kw.intrinsic, module_device(parts.train_agent)))
    if d.num_learners > 1:  # N data-parallel ranks; this copy acts, publishes and checkpoints rank 0's weights
        rank_agent = copy.deepcopy(parts.train_agent).cpu()
        # a rank's minibatch is its share of one, so the optimizer steps per epoch stay those of one learner
        rank_kw = kw if kw.num_minibatches is not None else kw.model_copy(
            update={"batch_size": max(1, (kw.batch_size or DEFAULT_BATCH_SIZE) // d.num_learners)})
        algorithm = LearnerGroup(cast(PPOLearner, algorithm), partial(PPOLearner, rank_agent, rank_kw, total),
                                 attrgetter("agent"), shard_rollout, group_spec(d))
    return PolicyLearner(parts, algorithm)


def _ppo_collector(parts: EnvParts, learner: Learner[Any]) -> Collector[Any]:
    backend = parts.backend
    assert backend is not None
    kw, num_envs = _ppo_kw(parts), parts.cfg.distribution.num_envs
    steps = kw.steps_per_env(num_envs)
    if (kw.batch_size or 0) > steps * num_envs:  # works, but likely not as meant
        log.warning("policy.kwargs.batch_size %d is larger than one rollout (%d env steps: %d per env x %d envs): "
                    "every minibatch is the whole rollout. Lower batch_size, or raise n_steps or the env count.",
                    kw.batch_size, steps * num_envs, steps, num_envs)
    # one fragment per worker (read each time: the Ray backend resizes while running)
    return env_collector(parts, lambda: max(1, backend.num_workers), buffered=True)


def _appo_learner(parts: EnvParts) -> Learner[Any]:
    kw, d = cast(APPOKwargs, parts.cfg.policy.kwargs), parts.cfg.distribution
    algorithm: AlgorithmLearner[Rollout] = APPOLearner(parts.train_agent, kw, make_intrinsic(
        parts.observation_space, kw.intrinsic, module_device(parts.train_agent)))
    if d.num_learners > 1:  # N data-parallel ranks on each fragment's env columns; this copy acts and publishes
        algorithm = LearnerGroup(cast(APPOLearner, algorithm),
                                 partial(APPOLearner, copy.deepcopy(parts.train_agent).cpu(), kw),
                                 attrgetter("agent"), shard_rollout, group_spec(d))
    return PolicyLearner(parts, algorithm)


def _appo_collector(parts: EnvParts, learner: Learner[Any]) -> Collector[Any]:
    return env_collector(parts, lambda: 1)  # learns from each fragment as it arrives


# ---------------------------------------------------------------------- DQN, SAC
ITERATION_ENV_STEPS = 1000  # off-policy: log/checkpoint/eval intervals mean about what they mean for PPO


def _dqn_learner(parts: EnvParts) -> Learner[Any]:
    learner = DQNLearner(parts.train_agent, parts.cfg.policy.kwargs, parts.cfg.total_env_steps)
    learner.set_exploration(0)
    return PolicyLearner(parts, learner)


def _sac_learner(parts: EnvParts) -> Learner[Any]:
    obs, act, network = parts.observation_space, parts.action_space, network_settings(parts.cfg)
    learner = SACLearner(parts.train_agent, parts.cfg.policy.kwargs, lambda: QCritic(obs, act, *network), act,
                         parts.cfg.total_env_steps)
    learner.set_exploration(0)
    return PolicyLearner(parts, learner)


def _mbpo_learner(parts: EnvParts) -> Learner[Any]:
    obs, act, network, harness = parts.observation_space, parts.action_space, network_settings(parts.cfg), parts.cfg.harness
    kw = cast(MBPOKwargs, parts.cfg.policy.kwargs)
    model_replay = ReplayBuffer(kw.model_buffer_size, obs, act, seed=parts.cfg.seed + 1)
    learner = MBPOLearner(parts.train_agent, kw, lambda: QCritic(obs, act, *network), obs, act,
                          parts.cfg.total_env_steps, model_replay, MixedReplay, parts.checkpoint_dir,
                          getattr(harness, "id", None), getattr(harness, "kwargs", {}))
    learner.set_exploration(0)
    return PolicyLearner(parts, learner)


def replay_collector(parts: EnvParts, replay: ReplayBuffer) -> ReplayCollector:
    """The env collector feeding ``replay`` (n-step windows when ``n_step_return`` > 1; ``replay_mix``: gradient
    steps sample a share from an old dataset too)."""
    cfg = parts.cfg
    kw = cast(DQNKwargs | SACKwargs, cfg.policy.kwargs)
    nstep = NStepTransitions(kw.n_step_return, kw.gamma) if kw.n_step_return > 1 else None
    sampler = None
    if cfg.replay_mix is not None:
        sampler = MixedReplay(old_replay(cfg, parts.observation_space, parts.action_space), replay,
                              cfg.replay_mix.ratio)
    return ReplayCollector(env_collector(parts, lambda: 1), replay, nstep, parts.checkpoint_dir,
                           kw.save_replay_buffer, sampler)


def _dqn_collector(parts: EnvParts, learner: Learner[Any]) -> Collector[Any]:
    kw = cast(DQNKwargs, parts.cfg.policy.kwargs)
    obs, act = parts.observation_space, parts.action_space
    replay: ReplayBuffer
    if kw.prioritized_replay:
        replay = PrioritizedReplayBuffer(kw.buffer_size, obs, act, seed=parts.cfg.seed,
                                         alpha=kw.prioritized_replay_alpha, eps=kw.prioritized_replay_eps)
    else:
        replay = ReplayBuffer(kw.buffer_size, obs, act, seed=parts.cfg.seed)
    return replay_collector(parts, replay)


def _sac_collector(parts: EnvParts, learner: Learner[Any]) -> Collector[Any]:
    kw = cast(SACKwargs, parts.cfg.policy.kwargs)
    return replay_collector(parts, ReplayBuffer(kw.buffer_size, parts.observation_space, parts.action_space,
                                                seed=parts.cfg.seed))


# ---------------------------------------------------------------------- policy distillation
def _distill_learner(parts: EnvParts) -> Learner[Any]:
    from polar.trainers.loading import load_teacher

    kw = cast(DistillKwargs, parts.cfg.policy.kwargs)
    teacher = load_teacher(kw.teacher, parts.cfg.config_dir, parts.observation_space, parts.action_space)
    return PolicyLearner(parts, DistillLearner(parts.train_agent, teacher.to(parts.device), kw, parts.cfg.seed))


# ---------------------------------------------------------------------- BC, IQL, CQL (from a dataset)
def _offline_learner(make: Callable[[EnvParts], AlgorithmLearner[Any]]) -> Callable[[EnvParts], Learner[Any]]:
    return lambda parts: PolicyLearner(parts, make(parts), publish=False)


def _cql(parts: EnvParts) -> AlgorithmLearner[Any]:
    kw = cast(CQLKwargs, parts.cfg.policy.kwargs)
    obs, act = parts.observation_space, parts.action_space
    if isinstance(act, gym.spaces.Discrete):
        return DiscreteCQLLearner(parts.policy.agent, kw)
    hidden, activation, _ = network_settings(parts.cfg)
    critic_hidden = list(kw.critic_hidden or hidden)
    return CQLLearner(parts.policy.agent, kw, lambda: QCritic(obs, act, critic_hidden, activation, []), act)


def dataset_collector(parts: EnvParts, learner: Learner[Any]) -> Collector[Any]:
    """Minibatches of ``policy.kwargs.dataset`` (read in ``polar.trainers.build``), ``steps_per_iteration`` per
    iteration, the last one stopping at ``gradient_steps`` exactly."""
    from polar.rollout.dataset import DatasetCollector

    kw = cast(OfflineKwargs, parts.cfg.policy.kwargs)
    data = parts.extra["dataset"]
    spi, total = kw.steps_per_iteration, kw.gradient_steps
    return DatasetCollector(data, kw.batch_size, lambda: max(1, min(spi, total - n_updates(learner))), parts.seed,
                            parts.policy.obs_norm)


def _gradient_steps(cfg: EnvRunConfig) -> int:
    return cast(OfflineKwargs, cfg.policy.kwargs).gradient_steps


# ---------------------------------------------------------------------- GAIL, AIRL (PPO on a discriminator's reward)
def _imitation_learner(make: Callable[..., Discriminator]) -> Callable[[EnvParts], Learner[Any]]:
    """PPO's learner on the rollouts, a ``make`` discriminator against ``policy.kwargs.dataset`` (read and checked
    against the env's spaces here, before the first rollout)."""

    def build(parts: EnvParts) -> Learner[Any]:
        from polar.datasets.minari import load_dataset

        kw = cast(GAILKwargs, parts.cfg.policy.kwargs)
        obs_space, act_space = parts.observation_space, parts.action_space
        check_spaces(obs_space, act_space, f"policy.type {parts.cfg.policy.type!r}")
        data = load_dataset(kw.dataset, parts.cfg.config_dir, obs_space, act_space, where="policy.kwargs.dataset")
        discrete = isinstance(act_space, gym.spaces.Discrete)
        expert = Transitions(torch.as_tensor(data.obs).float(),
                             torch.as_tensor(data.actions.astype(np.int64 if discrete else np.float32)),
                             torch.as_tensor(data.next_obs).float(), torch.as_tensor(data.terminated))
        log.info("expert %s: %d transitions, %d episodes (return mean %.4g)", data.dataset_id, len(data),
                 len(data.episode_returns), float(np.mean(data.episode_returns)))
        disc = make(obs_space, act_space, expert.obs, list(kw.disc_hidden), kw.gamma)
        if disc.needs_log_pi and getattr(parts.train_agent, "recurrent", False):
            raise ConfigError(f"policy.type {parts.cfg.policy.type!r} reads log pi(a|s) of single expert transitions, "
                              "which a recurrent agent cannot give without its episode's history; use agent.type: mlp")
        ppo = PPOLearner(parts.train_agent, kw, parts.cfg.total_env_steps)
        return PolicyLearner(parts, GAILLearner(ppo, disc, expert, kw, seed=parts.seed))

    return build


def _ppo_steps_per_env(cfg: EnvRunConfig) -> int:
    return cast(PPOKwargs, cfg.policy.kwargs).steps_per_env(cfg.distribution.num_envs)

# ---------------------------------------------------------------------- hierarchical (manager + skills)
def _hierarchical_learner(manager: torch.nn.Module, skills: dict[str, torch.nn.Module | None],
                          kw: HierarchicalKwargs, total_env_steps: int) -> HierarchicalLearner:
    """PPO for the manager (SMDP GAE: its fragments carry durations) and for every trained skill."""
    return HierarchicalLearner(PPOLearner(manager, kw.manager, total_env_steps),
                               {n: PPOLearner(a, kw.ppo, total_env_steps) if a is not None else None
                                for n, a in skills.items()})


def _hierarchical_compose(cfg: EnvRunConfig, run_dir: RunDir, **kwargs: Any) -> TrainingLoop[Any]:
    from polar.trainers.hierarchical import compose_hierarchical

    return compose_hierarchical(cfg, run_dir, _hierarchical_learner, **kwargs)


def _hierarchical_evaluate(cfg: EnvRunConfig, state: Mapping[str, Any], episodes: int | None, seed: int | None,
                           deterministic: bool) -> dict[str, Any]:
    from polar.trainers.hierarchical import evaluate_hierarchical

    return evaluate_hierarchical(cfg, state, episodes, seed, deterministic)


# ---------------------------------------------------------------------- the table
ALGORITHMS: dict[str, Algorithm] = {
    "ppo": Algorithm(PPOKwargs, _ppo_learner, _ppo_collector,
                     steps_per_env=lambda cfg: cast(PPOKwargs, cfg.policy.kwargs).steps_per_env(cfg.distribution.num_envs),
                     on_policy=True),
    "appo": Algorithm(APPOKwargs, _appo_learner, _appo_collector,
                      steps_per_env=lambda cfg: cast(APPOKwargs, cfg.policy.kwargs).n_steps),
    "dqn": Algorithm(DQNKwargs, _dqn_learner, _dqn_collector, iteration_env_steps=ITERATION_ENV_STEPS,
                     steps_per_env=lambda cfg: cast(DQNKwargs, cfg.policy.kwargs).train_freq),
    "sac": Algorithm(SACKwargs, _sac_learner, _sac_collector, iteration_env_steps=ITERATION_ENV_STEPS,
                     steps_per_env=lambda cfg: cast(SACKwargs, cfg.policy.kwargs).train_freq),
    "bc": Algorithm(BCKwargs, _offline_learner(lambda p: BCLearner(p.policy.agent, p.cfg.policy.kwargs)),
                    dataset_collector, gradient_steps=_gradient_steps),
    "iql": Algorithm(IQLKwargs, _offline_learner(lambda p: IQLLearner(p.policy.agent, p.cfg.policy.kwargs,
                                                                      p.observation_space, p.action_space)),
                     dataset_collector, gradient_steps=_gradient_steps),
    "cql": Algorithm(CQLKwargs, _offline_learner(_cql), dataset_collector, gradient_steps=_gradient_steps),
    "mbpo": Algorithm(MBPOKwargs, _mbpo_learner, _sac_collector, iteration_env_steps=ITERATION_ENV_STEPS,
                      steps_per_env=lambda cfg: cast(MBPOKwargs, cfg.policy.kwargs).train_freq),
    "gail": Algorithm(GAILKwargs, _imitation_learner(GAILDiscriminator), _ppo_collector, steps_per_env=_ppo_steps_per_env,
                      on_policy=True),
    "airl": Algorithm(AIRLKwargs, _imitation_learner(AIRLDiscriminator), _ppo_collector, steps_per_env=_ppo_steps_per_env,
                      on_policy=True),
    "hierarchical": Algorithm(HierarchicalKwargs, None, None, own_loop=OwnLoop(_hierarchical_compose,
                                                                                _hierarchical_evaluate),
                              steps_per_env=lambda cfg: cast(HierarchicalKwargs, cfg.policy.kwargs).steps_per_env(
                                  cfg.distribution.num_envs)),
    "distill": Algorithm(DistillKwargs, _distill_learner, lambda parts, _: env_collector(parts, lambda: 1),
                         steps_per_env=lambda cfg: cast(DistillKwargs, cfg.policy.kwargs).n_steps),
}


# ---------------------------------------------------------------------- GRPO, SFT (agent runs)
def _sft_stage(cfg: AgentRunConfig, policy: LLMPolicy, demonstrations: str, kwargs: SFTKwargs
               ) -> tuple[Stage[Any], Learner[Any]]:
    """SFT on ``demonstrations`` (a chat JSONL or a ``polar generate`` dataset) as a stage of the loop."""
    from polar.models.llm_policy import load_demonstrations

    demos = load_demonstrations(resolve(demonstrations, cfg.config_dir), policy.tokenizer)
    sft = SFTLearner(policy, kwargs)
    learner: Learner[Any] = sft
    d = cfg.distribution
    if d.num_learners > 1:  # N data-parallel ranks, each on its share of a minibatch; this copy publishes rank 0's
        learner = LearnerGroup(sft, partial(SFTLearner, copy.deepcopy(policy), kwargs), attrgetter("policy.model"),
                               shard_samples, group_spec(d))
    steps = sft_steps(len(demos), kwargs)
    log.info("SFT: %d steps over %d demonstrations", steps, len(demos))
    collector = DemonstrationCollector(demonstration_batches(demos, kwargs, cfg.seed))
    return Stage("sft", collector, learner, iterations_budget(steps)), learner


def check_grpo(cfg: AgentRunConfig) -> None:
    kw = cfg.policy.kwargs
    if not cfg.tasks:
        raise ConfigError("policy grpo needs 'tasks: FILE.jsonl' (the prompts to roll out)")
    sft = cfg.sft_warmup
    if sft is not None and sft.kwargs.lora is not None and kw.lora is None:
        raise ConfigError("sft_warmup.kwargs.lora is set but policy.kwargs.lora is not; use the same for both")


def check_sft(cfg: AgentRunConfig) -> None:
    if not isinstance(cfg.tasks, str):
        raise ConfigError("policy sft needs 'tasks: FILE.jsonl' (the demonstrations: a chat JSONL or a polar "
                          f"generate dataset), not {cfg.tasks!r}")


def llm_teacher(teacher: TeacherConfig, policy: LLMPolicy, config_dir: Path) -> torch.nn.Module:
    """The frozen model of ``policy.kwargs.teacher``, on the student's device: a preset or local HF folder the
    embedded engine loads, or a polar GRPO / SFT run (its folder: the latest checkpoint; or a checkpoint file)
    rebuilt on its own base model with its LoRA merged. Its tokenizer must be the student's (it scores the
    student's token ids). A relative path is the config file's."""
    from polar.inference.loading import load_engine
    from polar.inference.presets import get_preset
    from polar.inference.upstream import UPSTREAM_KINDS
    from polar.trainers.loading import is_run_target, load_llm_run_model

    key = f"policy.kwargs.teacher.name_or_path {teacher.name_or_path!r}"
    path = config_dir / Path(teacher.name_or_path).expanduser()
    if is_run_target(path):
        tokenizer, model = load_llm_run_model(path, key)
    else:
        is_name = get_preset(teacher.name_or_path) is not None or teacher.name_or_path.split(":", 1)[0] in UPSTREAM_KINDS
        if not is_name and not path.exists():
            raise ConfigError(f"{key}: {path} does not exist; give a preset (tiny, smollm2-135m), a local HF folder, "
                              "or a polar GRPO or SFT run (its folder or a checkpoint file in it)")
        engine = load_engine(str(path) if path.is_dir() else teacher.name_or_path,
                             config_key="policy.kwargs.teacher.name_or_path")
        tokenizer, model = engine.tokenizer, getattr(engine, "model", None)
        if model is None:
            raise ConfigError(f"{key}: the teacher scores tokens with a forward pass, so it must be a preset, a local "
                              "HF folder the embedded engine loads or a polar run, not an upstream server")
        model = copy.deepcopy(model)
    if tokenizer.get_vocab() != policy.tokenizer.get_vocab():
        raise ConfigError(f"{key}: its tokenizer ({len(tokenizer.get_vocab())} tokens) is not the student's "
                          f"({len(policy.tokenizer.get_vocab())} tokens); the teacher scores the student's token ids, "
                          "so both need the same tokenizer")
    model = model.float().to(policy.device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return cast(torch.nn.Module, model)


def grpo_parts(ctx: AgentContext) -> AgentParts:
    """GRPO: the session collector (dynamic sampling, difficulty filter, curriculum), ``GRPOLearner``, the
    held-out evaluator before / every ``eval_every`` / after, ``total_steps`` iterations; the SFT warm-up
    (``sft_warmup``) as the first stage of a fresh run."""
    cfg, kw = ctx.cfg, ctx.cfg.policy.kwargs
    assert isinstance(kw, GRPOKwargs)  # the row's kwargs model
    warm_up = []
    if cfg.sft_warmup is not None and ctx.state is None:
        warm_up.append(_sft_stage(cfg, ctx.policy, cfg.sft_warmup.demonstrations, cfg.sft_warmup.kwargs)[0])
    grpo = GRPOLearner(ctx.policy, kw, llm_teacher(kw.teacher, ctx.policy, cfg.config_dir) if kw.teacher is not None else None)
    learner: Learner[Any] = grpo
    d = cfg.distribution
    if d.num_learners > 1:  # N data-parallel ranks, each on whole groups; this copy publishes rank 0's weights
        learner = LearnerGroup(grpo, partial(GRPOLearner, copy.deepcopy(ctx.policy), kw, grpo.teacher),
                               attrgetter("policy.model"),
                               partial(shard_groups, signal=partial(has_signal, overlong_filter=bool(kw.overlong_filter))),
                               group_spec(d))
    tasks = load_tasks(cfg.tasks, cfg.config_dir) if cfg.tasks else []
    difficulty = TaskDifficulty(kw.difficulty_filter) if kw.difficulty_filter is not None else None
    source = cfg.tasks  # a reasoning-gym source whose levels advance: a curriculum
    curriculum = Curriculum(source) if isinstance(source, ReasoningGymTasks) and source.advance is not None else None
    # dynamic sampling fills a step with groups whose rewards differ; the critic's baseline needs none
    # (nor does a teacher, which grades every token)
    dynamic = kw.advantage != "value_head" and kw.teacher is None and kw.dynamic_sampling.max_extra_rounds > 0
    overlong_filter = bool(kw.overlong_filter)
    signal: Callable[[list[SessionResult]], bool] | None = (lambda g: has_signal(g, overlong_filter)) if dynamic else None
    pr = kw.partial_rollouts
    partial_rollouts = PartialRollouts(kw.max_off_policy_steps, pr.max_groups_in_flight
                              or kw.tasks_per_step * (kw.max_off_policy_steps + 1)) if pr is not None else None
    collector = SessionCollector(
        ctx.stack, tasks, kw.tasks_per_step, kw.group_size, cfg.seed, batches=kw.total_steps,
        prefetch=kw.max_off_policy_steps >= 1, max_extra_rounds=kw.dynamic_sampling.max_extra_rounds if dynamic else 0,
        signal=signal, difficulty=difficulty, curriculum=curriculum, partial=partial_rollouts)
    evaluator = AgentEvaluator(ctx.run_dir, ctx.stack, ctx.eval_tasks, kw.eval_samples, ctx.state is not None,
                               grpo, kw.eval_every, kw.total_steps, name="grpo")
    return AgentParts(collector, learner, evaluator, iterations_budget(kw.total_steps), warm_up,
                      episode_window=kw.tasks_per_step * kw.group_size)


def sft_parts(ctx: AgentContext) -> AgentParts:
    """SFT: the whole run is the warm-up stage (``tasks`` are the demonstrations), so its checkpoint is
    ``ckpt_00000000.pt``; no GRPO iteration follows, the final evaluation scores the trained weights."""
    cfg, kw = ctx.cfg, ctx.cfg.policy.kwargs
    assert isinstance(kw, SFTKwargs)  # the row's kwargs model
    assert isinstance(cfg.tasks, str)  # check_sft
    stage, learner = _sft_stage(cfg, ctx.policy, cfg.tasks, kw)
    collector = SessionCollector(ctx.stack, [], 1, 1, cfg.seed, batches=0, prefetch=False)  # publishes only
    evaluator = AgentEvaluator(ctx.run_dir, ctx.stack, ctx.eval_tasks, 1, ctx.state is not None)
    return AgentParts(collector, learner, evaluator, iterations_budget(0), [stage] if ctx.state is None else [])


# agent runs: the loop polar.trainers.agentic_run.build_agent_loop composes around the run's rollout stack
AGENT_ALGORITHMS: dict[str, AgentAlgorithm] = {
    "grpo": AgentAlgorithm(GRPOKwargs, grpo_parts, check=check_grpo),
    "sft": AgentAlgorithm(SFTKwargs, sft_parts, check=check_sft),
}


def agent_algorithm(cfg: AgentRunConfig) -> AgentAlgorithm:
    """The agent row of ``cfg.policy.type``."""
    row = AGENT_ALGORITHMS.get(cfg.policy.type)
    if row is None:
        raise ConfigError(f"policy.type {cfg.policy.type!r}: agent harnesses train with "
                          f"{' or '.join(map(repr, AGENT_ALGORITHMS))}")
    return row


def algorithm(cfg: EnvRunConfig) -> Algorithm:
    """The row of ``cfg.policy.type``."""
    row = ALGORITHMS.get(cfg.policy.type)
    if row is None:
        raise ConfigError(f"policy.type {cfg.policy.type!r}: env harnesses train with "
                          f"{', '.join(map(repr, ALGORITHMS))}; {' and '.join(AGENT_ALGORITHMS)} need harness.type: agent")
    return row
