"""Run directories for evaluation tests: real polar run directories (config.resolved.yaml, run.json,
checkpoints/) whose checkpoints hold policies of distinct, seeded initialisations, so suites have two
different checkpoints of each harness without minutes of training."""

from __future__ import annotations

import json
from pathlib import Path

import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def make_env_run(path: Path, config: Path, seeds=(1, 2), overrides=None) -> Path:
    from polar.config import dump_config, load_config
    from polar.harness import make_env
    from polar.models.policy import build_policy
    from polar.trainers.checkpoint import CheckpointManager
    from polar.trainers.run_dir import RunDir

    cfg = load_config(config, overrides)
    run = RunDir.create(cfg.name, path, kind=cfg.policy.type, config_dir=cfg.config_dir)
    run.write_config(dump_config(cfg))
    env = make_env(cfg.harness, cfg.config_dir)
    try:
        obs_space, act_space = env.observation_space, env.action_space
    finally:
        env.close()
    ckpts = CheckpointManager(run.checkpoints_dir)
    for i, seed in enumerate(seeds, 1):
        torch.manual_seed(seed)
        policy = build_policy(cfg, obs_space, act_space, cfg.config_dir)
        ckpts.save(i, {"policy": policy.state_dict(), "env_steps": 256 * i, "iteration": i, "policy_version": i})
    run.update_meta(status="finished")
    return run.path


def make_agent_run(path: Path, tasks: list[dict], noise=(0.0, 0.05)) -> Path:
    """The calculator agent (examples/agentic) on the tiny model: checkpoint 1 the tiny weights, checkpoint 2
    the same plus seeded noise; ``tasks`` become the run's eval_tasks (written next to the run)."""
    from polar.config import dump_config, load_config
    from polar.inference import load_engine
    from polar.models.llm_policy import LLMPolicy
    from polar.trainers.checkpoint import CheckpointManager
    from polar.trainers.run_dir import RunDir

    path.parent.mkdir(parents=True, exist_ok=True)
    heldout = path.parent / f"{path.name}-heldout.jsonl"
    heldout.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    cfg = load_config(EXAMPLES / "agentic" / "calculator_grpo.yaml", [f"eval_tasks={heldout}"])
    run = RunDir.create(cfg.name, path, kind="agentic-grpo", config_dir=cfg.config_dir)
    run.write_config(dump_config(cfg))
    engine = load_engine("tiny", seed=cfg.seed)
    policy = LLMPolicy.from_engine(engine)
    base = {k: v.clone() for k, v in policy.state_dict().items()}
    ckpts = CheckpointManager(run.checkpoints_dir)
    for i, scale in enumerate(noise, 1):
        gen = torch.Generator().manual_seed(i)
        state = {k: (v + scale * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v)
                 for k, v in base.items()}
        ckpts.save(i, {"model": state, "step": i, "policy_version": i})
    run.update_meta(status="finished")
    return run.path
