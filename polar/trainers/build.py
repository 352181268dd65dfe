"""Config -> training loop: the one place that chooses. ``polar run``, ``resume``, ``eval`` and ``generate``
all come through here.

Two choices, made once:

- **what learns**: an agent run (``harness.type: agent``, or ``agent: {type: llm}`` on an env harness) trains
  an LLM policy with GRPO or SFT on session groups (the loop ``polar.trainers.agentic_run.build_agent_loop`` composes); an env run trains
  PPO/APPO/DQN/SAC on env fragments (``polar.trainers.registry``);
- **where the learner runs**: ``distribution.backend: local`` in this process; ``ray`` in a learner actor
  that runs the same loop (``polar.trainers.ray_driver``). An agent run on Ray also spreads its sessions over
  ``rollout_workers`` gateway nodes (each with its engine) that the learner actor places; any
  ``distribution`` key an agent run cannot honour fails here, before anything starts
  (``agent_distribution_problems``).

Whichever it is, the result has ``train() -> dict`` and goes through ``polar.trainers.loop``. A new
Collector (a Ray session collector for gateway nodes, say) is chosen here and passed to the trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from polar.config.policy import OFFLINE
from polar.config.run import AgentRunConfig, RunConfig, RunKind
from polar.errors import ConfigError
from polar.trainers.loop import OnIteration
from polar.trainers.preflight import check_agent_distribution
from polar.trainers.registry import trainer_class
from polar.trainers.run_dir import RunDir


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

            return RayLearnerDriver(cfg, run_dir, resume=resume, on_iteration=on_iteration)
        from polar.trainers.agentic_run import build_agent_loop

        return build_agent_loop(cfg, run_dir, resume=resume, on_iteration=on_iteration, engine=engine)
    if cfg.distribution.backend == "ray" and cfg.policy.type in OFFLINE:
        raise ConfigError(f"policy.type {cfg.policy.type!r} trains from a dataset in this process; set "
                          "distribution.backend: local")
    if cfg.harness.type == "pettingzoo":  # multi-agent: its own collector, one PPO learner per policy
        from polar.trainers.multi_agent import MultiAgentTrainer

        return MultiAgentTrainer(cfg, run_dir, resume=resume, on_iteration=on_iteration)
    if cfg.distribution.backend == "ray":
        from polar.trainers.ray_driver import RayLearnerDriver

        return RayLearnerDriver(cfg, run_dir, resume=resume, on_iteration=on_iteration)
    return trainer_class(cfg)(cfg, run_dir, resume=resume, on_iteration=on_iteration)


def progress_total(cfg: RunConfig) -> int:
    """The ``env_steps`` a finished run has counted (the progress bar's 100%): ``total_env_steps`` for env runs;
    for GRPO ``total_steps x tasks_per_step x group_size`` sessions; for SFT the configured optimizer steps
    (``max_steps``, else unknown until the demonstrations are read: 0)."""
    if not isinstance(cfg, AgentRunConfig):
        return cfg.total_env_steps
    kw: Any = cfg.policy.kwargs
    if cfg.policy.type == "grpo":
        return int(kw.total_steps * kw.tasks_per_step * kw.group_size)
    return int(kw.max_steps)


def evaluate_run(target: str | Path, episodes: int | None = None, seed: int | None = None,
                 stochastic: bool = False, engine: Any = None) -> tuple[RunDir, RunConfig, dict[str, Any]]:
    """``polar eval``: a run directory's latest checkpoint (or the checkpoint file ``target``), evaluated and
    written to ``eval/eval_<checkpoint>_<time>.json``. Env runs: deterministic episodes on fresh env instances;
    agent runs: the held-out ``eval_tasks`` (``episodes`` sessions per task) through the run's own stack."""
    import time

    from polar.trainers.loading import load_policy_for_eval, resolve_target

    if episodes is not None and episodes < 1:
        raise ConfigError("--episodes must be at least 1")
    run_dir, cfg, ckpt = resolve_target(Path(target))
    if run_kind(cfg) == "agent":
        from polar.trainers.agentic_run import evaluate_agent_run

        res = evaluate_agent_run(run_dir, cfg, ckpt, episodes, engine=engine)
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
    else:
        from polar.trainers.evaluation import evaluate_policy

        run_dir, cfg, policy, path, state = load_policy_for_eval(Path(target))
        ev = cfg.eval
        res = evaluate_policy(policy, cfg.harness, episodes or ev.episodes, ev.seed if seed is None else seed,
                              not stochastic and ev.deterministic, ev.num_envs, cfg.config_dir)
        res.update(checkpoint=str(path), env_steps=int(state["env_steps"]), iteration=int(state["iteration"]))
        name = path.stem
    out = run_dir.write_json(f"eval/eval_{name}_{time.strftime('%Y%m%d-%H%M%S')}.json", res)
    return run_dir, cfg, {**res, "written": str(out)}


def build_session_stack(cfg: RunConfig, work_dir: str | Path, engine: Any = None, records_dir: Path | None = None) -> Any:
    """Engine + gateway + rollout service for an agent config, not started (``polar generate``, evaluation
    suites); calls are recorded under ``records_dir`` (default ``work_dir/gateway/sessions``)."""
    from polar.harness.sessions import session_runner
    from polar.trainers.agentic_run import build_stack

    if not isinstance(cfg, AgentRunConfig):
        session_runner(cfg)  # raises the ConfigError that says what an agent run needs
        raise ConfigError(f"{cfg.name}: not an agent run")
    return build_stack(cfg, Path(work_dir), engine, records_dir=records_dir)
