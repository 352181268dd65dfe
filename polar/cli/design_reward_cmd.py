"""``polar design-reward --config FILE``: an LLM writes reward functions, polar keeps the best (Eureka-style).

The config names the env (a Gymnasium id and its description), the budget (rounds, candidates per round,
PPO steps per candidate, how many train at once) and the designing engine (``model:``, as in an agent
run: a local model or ``engine: openai_compat`` for a hosted one). Each candidate runs in bubblewrap
(polar.llm_roles.sandboxed_reward); the results go to ``--out`` as JSON. See docs/llm-roles.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from polar.config.agentic import ModelConfig
from polar.config.base import StrictModel
from polar.errors import ConfigError

HELP = "let an LLM write reward functions; train a short PPO run on each and keep the best"

log = logging.getLogger("polar.design_reward")


class DesignRewardConfig(StrictModel):
    env_id: str = Field(description="the Gymnasium id whose reward is designed; its own reward is the score")
    description: str = Field(description="what the engine is told about the env: observations, actions, the goal")
    rounds: int = Field(2, ge=1, le=20)
    candidates_per_round: int = Field(3, ge=1, le=16)
    total_env_steps: int = Field(4096, ge=256, description="PPO env steps per candidate")
    score_episodes: int = Field(20, ge=1, description="score = mean task return of the last N training episodes")
    max_parallel: int = Field(1, ge=1, description="candidates that train at once (one process each)")
    backend: Literal["local", "ray"] = Field(
        "local", description="local: candidates train in child processes here; ray: as Ray tasks on the cluster at "
        "coordinator_address (each still one `polar run`, the candidate in bubblewrap on the node that runs it)")
    coordinator_address: str | None = Field(
        None, description="backend: ray: 'host:port' or 'auto' to join a cluster; null starts a local one")
    call_timeout_s: float = Field(5.0, gt=0, description="a compute_reward call slower than this fails the candidate")
    run_timeout_s: float = Field(600.0, gt=0)
    ppo_kwargs: dict[str, Any] = Field(default_factory=lambda: {
        "n_steps": 64, "batch_size": 128, "n_epochs": 4, "learning_rate": 1e-3, "gamma": 0.99})
    seed: int = 0
    max_tokens: int = Field(1024, ge=16, description="longest reply of the designing engine")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the designing engine")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", required=True, help="reward-design YAML (env_id, description, model, budget)")
    p.add_argument("--out", default="reward_design.json", help="results JSON (default reward_design.json)")
    p.add_argument("--work-dir", default=None, help="keep candidates and their runs here (default: a temp folder)")


def load(path: Path) -> DesignRewardConfig:
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file; give the reward-design YAML")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping (env_id, description, model, ...)")
    try:
        return DesignRewardConfig.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"{path}: {where}: {err['msg']} (got {err.get('input')!r}); fix it in the YAML") from None


def main(args: argparse.Namespace) -> int:
    from polar.harness.gymnasium_adapter import check_id
    from polar.inference.chat import chat_function
    from polar.inference.loading import load_engine
    from polar.llm_roles.reward_design import RewardDesignConfig, design_reward

    cfg = load(Path(args.config))
    if cfg.backend == "local" and cfg.coordinator_address is not None:
        raise ConfigError(f"{args.config}: coordinator_address is for backend: ray (backend is local); set backend: ray "
                          "or remove it")
    try:
        check_id(cfg.env_id)
    except ConfigError as e:
        raise ConfigError(f"{args.config}: env_id: {str(e).removeprefix('harness.id: ')}") from None
    m = cfg.model
    if m.engine == "openai_compat":
        engine = load_engine(m.model, engine="openai_compat", config_key="model.model", **m.openai_compat_options())
    else:
        engine = load_engine(m.name_or_path, engine=m.engine, chat_template=m.chat_template, **m.engine_kwargs)
    design = RewardDesignConfig(
        env_id=cfg.env_id, description=cfg.description, rounds=cfg.rounds,
        candidates_per_round=cfg.candidates_per_round, total_env_steps=cfg.total_env_steps,
        score_episodes=cfg.score_episodes, max_parallel=cfg.max_parallel, call_timeout_s=cfg.call_timeout_s,
        run_timeout_s=cfg.run_timeout_s, ppo_kwargs=cfg.ppo_kwargs, seed=cfg.seed, backend=cfg.backend)
    cluster = None
    if cfg.backend == "ray":
        from polar.distributed.cluster import connect

        cluster = connect(cfg.coordinator_address)

    def report(c: Any) -> None:
        verdict = f"score {c.score:.2f}" if c.score is not None else f"failed: {c.error}"
        log.info("round %d candidate %d: %s", c.round, c.index, verdict)

    try:
        result = asyncio.run(design_reward(design, chat_function(engine, max_tokens=cfg.max_tokens),
                                           Path(args.work_dir) if args.work_dir else None, on_candidate=report))
    finally:
        if cluster is not None and cluster.started_local:
            cluster.shutdown()
    Path(args.out).write_text(json.dumps(result.as_dict(), indent=2))
    if result.best is None:
        log.error("no candidate trained: every one failed (reasons in %s)", args.out)
        return 1
    log.info("best: round %d candidate %d, score %.2f (all results in %s)", result.best.round, result.best.index,
             result.best.score or 0.0, args.out)
    return 0
