"""Config -> training loop: the one place that composes. ``polar run``, ``resume``, ``eval`` and ``generate``
all come through here, and the Ray learner actor calls the same ``compose``.

Two choices, made once:

- **what learns**: an agent run (``harness.type: agent``, or ``agent: {type: llm}`` on an env harness) trains
  an LLM policy with GRPO or SFT on session groups (``polar.trainers.agentic_run.build_agent_loop``); an env run is
  composed from its algorithm's row in ``polar.trainers.registry`` (``compose``): the env side (a rollout
  backend, or a dataset), the acting policy, the row's learner and collector, the evaluator, into the one
  ``polar.trainers.loop.TrainingLoop``;
- **where the learner runs**: ``distribution.backend: local`` in this process; ``ray`` in a learner actor
  that composes the same loop with its own backend (``polar.trainers.ray_driver``). An agent run on Ray also
  spreads its sessions over ``rollout_workers`` gateway nodes (each with its engine) that the learner actor
  places; any ``distribution`` key an agent run cannot honour fails here, before anything starts
  (``agent_distribution_problems``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from polar.config.run import AgentRunConfig, EnvRunConfig, RunConfig, RunKind
from polar.errors import ConfigError
from polar.trainers.loop import OnIteration, TrainingLoop
from polar.trainers.preflight import check_agent_distribution
from polar.trainers.run_dir import RunDir
from polar.types import Collector, Metrics

if TYPE_CHECKING:
    import gymnasium as gym

    from polar.config.gateway import ActionCacheConfig
    from polar.datasets.minari import Transitions
    from polar.models.policy import Policy
    from polar.rollout.backends.base import RolloutBackend
    from polar.trainers.env_run import EnvParts
    from polar.trainers.observe import RunLogs

log = logging.getLogger(__name__)

#: ``(cfg, fragment_steps, seed, config_dir=..., on_policy=...) -> RolloutBackend`` (default ``make_backend``;
#: the Ray learner actor passes its own, with restart and autoscale options)
BackendFactory = Callable[..., Any]


class Trainer(Protocol):
    def train(self) -> dict[str, Any]: ...


def run_kind(cfg: RunConfig) -> RunKind:
    """``agent`` (GRPO/SFT on sessions: ``harness.type: agent``, or the LLM agent on an env harness) or ``env``
    (PPO/APPO/DQN/SAC on fragments); the config union decided it (``polar.config.run.run_kind_of``)."""
    return cfg.kind


def create_run_dir(cfg: RunConfig, run_dir: str | Path | None = None) -> RunDir:
    """A fresh run directory for ``cfg`` (``run.json`` kind: the algorithm, ``agentic-`` for agent runs)."""
    kind = f"agentic-{cfg.policy.type}" if run_kind(cfg) == "agent" else cfg.policy.type
    return RunDir.create(cfg.name, run_dir, kind=kind, config_dir=cfg.config_dir)


def _resume_state(cfg: RunConfig, run_dir: RunDir, resume: bool) -> Mapping[str, Any] | None:
    """The newest checkpoint that loads (``polar resume``), else None."""
    if not resume:
        return None
    from polar.trainers.checkpoint import CheckpointManager

    ckpt, state = CheckpointManager(run_dir.checkpoints_dir, keep=cfg.logging.keep_checkpoints).load_newest()
    log.info("resuming from checkpoint %s", ckpt)
    return state


def _seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def compose(cfg: EnvRunConfig, run_dir: RunDir, *, resume: bool = False, on_iteration: OnIteration | None = None,
            extra_metrics: Metrics | None = None, backend_factory: BackendFactory | None = None) -> TrainingLoop[Any]:
    """The loop of an env run: its algorithm's row (``polar.trainers.registry``) composed with the env side, the
    acting policy and the evaluator; resumed from the newest checkpoint when ``resume``. A PettingZoo harness
    composes its multi-agent collector and one learner per policy (``polar.trainers.multi_agent``)."""
    if cfg.harness.type == "pettingzoo":
        from polar.trainers.multi_agent import compose_multi_agent

        return compose_multi_agent(cfg, run_dir, resume=resume, on_iteration=on_iteration, extra_metrics=extra_metrics)
    from polar.trainers.observe import RunLogs

    logs = RunLogs(cfg.logging, run_dir)  # before the backend: its workers' start-up lines go to RUN/logs/
    try:
        return _compose_env(cfg, run_dir, resume=resume, on_iteration=on_iteration, extra_metrics=extra_metrics,
                            backend_factory=backend_factory, run_logs=logs)
    except BaseException:
        logs.close()
        raise


def _compose_env(cfg: EnvRunConfig, run_dir: RunDir, *, resume: bool, on_iteration: OnIteration | None,
                 extra_metrics: Metrics | None, backend_factory: BackendFactory | None,
                 run_logs: RunLogs) -> TrainingLoop[Any]:
    import torch

    from polar.models.policy import build_policy
    from polar.rollout.backends.base import make_backend
    from polar.trainers.continual import Continual
    from polar.trainers.device import learner_copy, learner_device
    from polar.trainers.env_run import EnvParts
    from polar.trainers.evaluation import EnvEvaluator
    from polar.trainers.loop import env_steps_budget
    from polar.trainers.registry import algorithm, n_updates

    row = algorithm(cfg)
    if row.own_loop is not None:  # several policies acting in this process (hierarchical)
        return row.own_loop.compose(cfg, run_dir, resume=resume, on_iteration=on_iteration,
                                    extra_metrics=extra_metrics, run_logs=run_logs)
    assert row.make_learner is not None and row.make_collector is not None  # rows without own_loop have both
    from_dataset = row.steps_per_env is None
    if from_dataset and cfg.distribution.backend != "local":
        raise ConfigError(f"policy.type {cfg.policy.type!r} trains from a dataset in this process; set "
                          "distribution.backend: local")
    state = _resume_state(cfg, run_dir, resume)
    _seed_everything(cfg.seed)
    # fresh env seeds on resume
    seed = cfg.seed if state is None else cfg.seed + 104_729 * (int(state["iteration"]) + 1)
    extra: dict[str, Any] = {}
    backend = None
    if row.steps_per_env is not None:
        # the one device rule of every learner (polar.trainers.device): CUDA for num_gpus >= 1 when present,
        # else CPU, with a log line when a GPU was asked for
        device = learner_device(cfg.distribution.num_gpus)
        if device.type != "cpu":
            log.info("distribution.num_gpus=%s: the %s learner trains on %s; rollouts and evaluation act with a "
                     "CPU copy of the policy", cfg.distribution.num_gpus, cfg.policy.type, device)
        backend = (backend_factory or make_backend)(_stage_cfg(cfg, state), row.steps_per_env(cfg), seed,
                                                    config_dir=cfg.config_dir, on_policy=row.on_policy)
        obs_space, act_space = backend.observation_space, backend.action_space
    else:
        device = torch.device("cpu")
        obs_space, act_space, extra["dataset"] = _dataset(cfg)
    try:
        policy = build_policy(cfg, obs_space, act_space, cfg.config_dir)
        if from_dataset and policy.obs_norm is not None:
            from polar.rollout.dataset import set_dataset_statistics

            set_dataset_statistics(policy.obs_norm, extra["dataset"], obs_space, cfg.policy.type)
        parts = EnvParts(_stage_cfg(cfg, state), run_dir, seed, device, obs_space, act_space, policy,
                         learner_copy(policy.agent, device), backend, state, extra=extra)

        def acting() -> Policy:
            parts.sync_acting_policy()
            return parts.policy

        parts.continual = Continual.create(cfg, acting)  # init, eval.old_tasks (polar.trainers.continual)
        learner = row.make_learner(parts)
        collector = row.make_collector(parts, learner)
        if cfg.curriculum is not None:
            assert row.steps_per_env is not None  # the config refuses a curriculum for dataset runs
            collector = _curriculum(cfg, parts, collector, row.steps_per_env(cfg), backend_factory or make_backend,
                                    on_policy=row.on_policy)
        if state is None and parts.continual is not None:  # before the collector starts with its weights
            parts.continual.apply(learner)
        attach = getattr(backend, "attach_run_dir", None)
        if attach is not None:  # ray: `polar scale RUN_DIR` resizes while running
            attach(run_dir.path)
        evaluator = EnvEvaluator(parts, row_fields=from_dataset)
        gradient_steps = row.gradient_steps
        if gradient_steps is not None:
            total = gradient_steps(cfg)
            evaluator.counters = lambda: {"gradient_steps": n_updates(learner)}
            budget = lambda p: n_updates(learner) >= total  # noqa: E731
        else:
            budget = env_steps_budget(cfg.total_env_steps)
        return TrainingLoop(cfg, run_dir, collector, learner, evaluator, budget=budget, state=state,
                            iteration_env_steps=row.iteration_env_steps,
                            stop_reward=None if from_dataset else cfg.stop_reward,
                            on_iteration=on_iteration, extra_metrics=extra_metrics, run_logs=run_logs)
    except BaseException:
        if backend is not None:
            backend.close()
        raise


def _stage_cfg(cfg: EnvRunConfig, state: Mapping[str, Any] | None, stage: int | None = None) -> EnvRunConfig:
    """``cfg`` with the harness of curriculum stage ``stage`` (default: the checkpoint's, 0 for a fresh run)."""
    if cfg.curriculum is None:
        return cfg
    from polar.config.curriculum import stage_harness
    from polar.rollout.curriculum import checkpoint_stage

    index = checkpoint_stage(state, cfg.curriculum) if stage is None else stage
    return cfg.model_copy(update={"harness": stage_harness(cfg.harness, cfg.curriculum.stages[index], index)})


def _curriculum(cfg: EnvRunConfig, parts: EnvParts, collector: Collector[Any], steps_per_env: int,
                backend_factory: BackendFactory, on_policy: bool = False) -> Collector[Any]:
    """The run's collector inside a ``CurriculumCollector``; every stage's env is made once first, so a stage that
    cannot start or whose spaces differ fails the run now, naming the stage."""
    from polar.harness import make_vector_env
    from polar.rollout.backends.collector import EnvCollector
    from polar.rollout.curriculum import CurriculumCollector, checkpoint_stage

    assert cfg.curriculum is not None
    for i in range(len(cfg.curriculum.stages)):
        where = f"curriculum.stages[{i}] ({cfg.curriculum.stages[i].kwargs})"
        try:
            probe = make_vector_env(_stage_cfg(cfg, None, i).harness, 1, seed=cfg.seed, config_dir=cfg.config_dir)
        except Exception as e:  # the env's own complaint (an unknown kwarg or level), named by the stage
            raise ConfigError(f"{where}: the env does not start: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        try:
            spaces = (probe.single_observation_space, probe.single_action_space)
        finally:
            probe.close()
        if spaces != (parts.observation_space, parts.action_space):
            raise ConfigError(f"{where}: its spaces {spaces[0]}, {spaces[1]} differ from the first stage's "
                              f"{parts.observation_space}, {parts.action_space}; every stage must keep the spaces "
                              "(pad observations to the largest stage)")
    env_collector = collector if isinstance(collector, EnvCollector) else getattr(collector, "env", None)
    if not isinstance(env_collector, EnvCollector):
        raise ConfigError(f"curriculum: policy {cfg.policy.type!r} collects no env fragments to switch")

    def backend_of(stage: int) -> RolloutBackend:
        seed = parts.seed + 1_000_003 * stage
        backend: RolloutBackend = backend_factory(_stage_cfg(cfg, None, stage), steps_per_env, seed,
                                                  config_dir=cfg.config_dir, on_policy=on_policy)
        return backend

    def use_backend(stage: int, backend: RolloutBackend) -> None:
        assert env_collector is not None
        env_collector.backend = backend
        parts.backend = backend
        parts.cfg = _stage_cfg(cfg, None, stage)  # the evaluator evaluates the stage being trained

    return CurriculumCollector(collector, cfg.curriculum, checkpoint_stage(parts.state, cfg.curriculum), backend_of,
                               use_backend)


def _dataset(cfg: EnvRunConfig) -> tuple[gym.Space[Any], gym.Space[Any], Transitions]:
    """A dataset run's env spaces (the env is made once to read them) and its transitions, checked against them,
    so a bad dataset fails before the first update."""
    import gymnasium as gym
    import numpy as np

    from polar.datasets.minari import load_dataset
    from polar.harness import make_vector_env

    probe = make_vector_env(cfg.harness, 1, seed=cfg.seed, config_dir=cfg.config_dir)
    try:
        obs_space, act_space = probe.single_observation_space, probe.single_action_space
    finally:
        probe.close()
    if not isinstance(obs_space, gym.spaces.Box):
        raise ConfigError(f"policy.type {cfg.policy.type!r}: offline training takes Box observations; the env's "
                          f"are {obs_space}")
    kw: Any = cfg.policy.kwargs
    data = load_dataset(kw.dataset, cfg.config_dir, obs_space, act_space, where="policy.kwargs.dataset")
    log.info("dataset %s: %d transitions, %d episodes (return mean %.4g)", data.dataset_id, len(data),
             len(data.episode_returns), float(np.mean(data.episode_returns)))
    return obs_space, act_space, data


def build_trainer(cfg: RunConfig, run_dir: RunDir, resume: bool = False, on_iteration: OnIteration | None = None,
                  engine: Any = None) -> Trainer:
    """The trainer ``polar run`` / ``polar resume`` use. ``engine``: an inference engine already loaded
    (agent runs; tests and benchmarks), instead of the one the config names."""
    if isinstance(cfg, AgentRunConfig):
        from polar.trainers.agentic_run import trained_engine_problem

        problem = trained_engine_problem(cfg)
        if problem is not None:
            raise ConfigError(problem)
        check_agent_distribution(cfg, engine)
        if cfg.distribution.backend == "ray":
            from polar.trainers.ray_driver import RayLearnerDriver

            return RayLearnerDriver(cfg, run_dir, compose, resume=resume, on_iteration=on_iteration)
        from polar.trainers.agentic_run import build_agent_loop
        from polar.trainers.registry import agent_algorithm

        return build_agent_loop(agent_algorithm(cfg), cfg, run_dir, resume=resume, on_iteration=on_iteration,
                                engine=engine)
    if cfg.distribution.backend == "ray":
        from polar.trainers.registry import algorithm

        row = algorithm(cfg)
        if row.steps_per_env is None or row.own_loop is not None:
            what = "trains from a dataset" if row.own_loop is None else "steps its envs"
            raise ConfigError(f"policy.type {cfg.policy.type!r} {what} in this process; set "
                              "distribution.backend: local")
        if cfg.harness.type != "pettingzoo":
            from polar.trainers.ray_driver import RayLearnerDriver

            return RayLearnerDriver(cfg, run_dir, compose, resume=resume, on_iteration=on_iteration)
    return compose(cfg, run_dir, resume=resume, on_iteration=on_iteration)


def progress_total(cfg: RunConfig) -> int:
    """The ``env_steps`` a finished run has counted (the progress bar's 100%): ``total_env_steps`` for env runs;
    for GRPO ``total_steps x tasks_per_step x group_size`` sessions; for SFT the configured optimizer steps
    (``max_steps``, else unknown until the demonstrations are read: 0)."""
    if not isinstance(cfg, AgentRunConfig):
        return cfg.total_env_steps
    from polar.config.grpo import GRPOKwargs

    kw = cfg.policy.kwargs
    if isinstance(kw, GRPOKwargs):
        return int(kw.total_steps * kw.tasks_per_step * kw.group_size)
    return int(kw.max_steps)


def evaluate_run(target: str | Path, episodes: int | None = None, seed: int | None = None,
                 stochastic: bool = False, engine: Any = None, greedy: bool = False,
                 action_cache: ActionCacheConfig | None = None) -> tuple[RunDir, RunConfig, dict[str, Any]]:
    """``polar eval``: a run directory's latest checkpoint (or the checkpoint file ``target``), evaluated and
    written to ``eval/eval_<checkpoint>_<time>.json``. Env runs: deterministic episodes on fresh env instances;
    agent runs: the held-out ``eval_tasks`` (``episodes`` sessions per task) through the run's own stack."""
    import time

    from polar.trainers.loading import load_policy_for_eval, resolve_target

    if episodes is not None and episodes < 1:
        raise ConfigError("--episodes must be at least 1")
    run_dir, cfg, ckpt = resolve_target(Path(target))
    if stochastic and run_kind(cfg) == "env":  # sampled actions: the same --seed samples the same episodes
        import torch

        torch.manual_seed(cfg.eval.seed if seed is None else seed)
    if run_kind(cfg) == "agent":
        from polar.trainers.agentic_run import evaluate_agent_run

        res = evaluate_agent_run(run_dir, cfg, ckpt, episodes, engine=engine, greedy=greedy, action_cache=action_cache)
        name = Path(res["checkpoint"]).stem
    elif cfg.harness.type == "pettingzoo":  # per-agent returns, win/draw/loss, against random and the pool
        from polar.trainers.checkpoint import CheckpointManager, load_checkpoint
        from polar.trainers.multi_agent import evaluate_multi_agent, load_multi_agent_policies

        path = ckpt or CheckpointManager(run_dir.checkpoints_dir).latest()
        if path is None:
            raise ConfigError(f"{run_dir.path} has no checkpoint yet; nothing to evaluate.")
        state = load_checkpoint(path)
        policies, mapping, pool = load_multi_agent_policies(cfg, state)
        h: Any = cfg.harness
        games = episodes or (h.self_play.eval_games if h.self_play is not None else cfg.eval.episodes)
        res = evaluate_multi_agent(cfg, policies, mapping, pool, games, cfg.eval.seed if seed is None else seed,
                                   not stochastic and cfg.eval.deterministic)
        res.update(checkpoint=str(path), env_steps=int(state["env_steps"]), iteration=int(state["iteration"]))
        name = path.stem
    elif (own := _own_loop(cfg)) is not None:  # a hierarchical run: its manager and skills play together
        from polar.trainers.checkpoint import CheckpointManager, load_checkpoint

        assert isinstance(cfg, EnvRunConfig)
        path = ckpt or CheckpointManager(run_dir.checkpoints_dir).latest()
        if path is None:
            raise ConfigError(f"{run_dir.path} has no checkpoint yet; nothing to evaluate.")
        state = load_checkpoint(path)
        res = own.evaluate(cfg, state, episodes, seed, not stochastic and cfg.eval.deterministic)
        res.update(checkpoint=str(path), env_steps=int(state["env_steps"]), iteration=int(state["iteration"]))
        name = path.stem
    else:
        from polar.trainers.evaluation import evaluate_policy

        run_dir, cfg, policy, path, state = load_policy_for_eval(Path(target))
        ev = cfg.eval
        harness = _stage_cfg(cfg, state).harness  # a curriculum run: the stage its checkpoint was training
        res = evaluate_policy(policy, harness, episodes or ev.episodes, ev.seed if seed is None else seed,
                              not stochastic and ev.deterministic, ev.num_envs, cfg.config_dir)
        res.update(checkpoint=str(path), env_steps=int(state["env_steps"]), iteration=int(state["iteration"]))
        name = path.stem
    out = run_dir.write_json(f"eval/eval_{name}_{time.strftime('%Y%m%d-%H%M%S')}.json", res)
    return run_dir, cfg, {**res, "written": str(out)}


def _own_loop(cfg: RunConfig) -> Any:
    """The registry row's ``own_loop`` of an env run (hierarchical), else None."""
    if not isinstance(cfg, EnvRunConfig):
        return None
    from polar.trainers.registry import algorithm

    return algorithm(cfg).own_loop


def build_session_stack(cfg: RunConfig, work_dir: str | Path, engine: Any = None, records_dir: Path | None = None) -> Any:
    """Engine + gateway + rollout service for an agent config, not started (``polar generate``, evaluation
    suites); calls are recorded under ``records_dir`` (default ``work_dir/gateway/sessions``)."""
    from polar.harness.sessions import session_runner
    from polar.trainers.agentic_run import build_stack

    if not isinstance(cfg, AgentRunConfig):
        session_runner(cfg)  # raises the ConfigError that says what an agent run needs
        raise ConfigError(f"{cfg.name}: not an agent run")
    return build_stack(cfg, Path(work_dir), engine, records_dir=records_dir)


def train_agentic(cfg: AgentRunConfig, run_dir: RunDir, resume: bool = False, engine: Any = None) -> dict[str, Any]:
    """An agent run from start to end in this process (``polar run`` does the same through ``build_trainer``;
    tests and benchmarks call this); returns its summary. ``run.json`` records this process as the run's owner
    and the run's final status, however it ends."""
    from polar.trainers.agentic_run import build_agent_loop
    from polar.trainers.lifecycle import run_guard
    from polar.trainers.registry import agent_algorithm

    with run_guard(run_dir, cfg.logging.sigterm_grace_s):
        return build_agent_loop(agent_algorithm(cfg), cfg, run_dir, resume=resume, engine=engine).train()
