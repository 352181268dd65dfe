"""Run directories for the deploy tests, written as the trainer writes them (config.resolved.yaml, run.json,
checkpoints through CheckpointManager) from a policy built from the config, with non-trivial observation
statistics so that baked-in normalisation is exercised."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from polar.config import RunConfig, validate
from polar.config.loader import dump_config
from polar.trainers.checkpoint import CheckpointManager
from polar.trainers.run_dir import RunDir

ENVS = {"cartpole": "CartPole-v1", "pendulum": "Pendulum-v1",
        "image": "tests.deploy.envs:PolarDeployImage-v0", "dict": "tests.deploy.envs:PolarDeployDict-v0"}


def run_config(env: str, agent: dict | None = None, policy: str = "ppo", continuous: bool = False,
               multi: bool = False, **kw):
    harness = {"type": "gymnasium", "id": ENVS[env]}
    if env in ("image", "dict") and (continuous or multi):
        harness["kwargs"] = {"continuous": continuous, "multi": multi}
    pol: dict = {"type": policy}
    if policy in ("ppo", "appo"):
        pol["kwargs"] = {"n_steps": 16, "batch_size": 16, "normalize_obs": True}
    elif policy in ("bc", "iql", "cql"):  # offline: the dataset is not read by export/serve, only the checkpoint
        pol["kwargs"] = {"dataset": "unused", "normalize_obs": True}
    return validate(RunConfig, {
        "name": f"{env}-{policy}", "harness": harness, "agent": agent or {"type": "mlp", "hidden_sizes": [32, 32], "cnn_channels": [4, 8]},
        "policy": pol, "distribution": {"backend": "local", "rollout_workers": 0, "envs_per_worker": 1},
        "total_env_steps": 64, "logging": {"tensorboard": False, "progress_bar": False}, "eval": {"at_end": False},
        **kw})


def write_run(path, cfg, iterations=(1,), seed: int = 0) -> RunDir:
    """A run directory with a checkpoint per iteration in ``iterations`` (different weights each)."""
    from polar.harness import make_vector_env
    from polar.models.policy import build_policy

    run = RunDir.create(cfg.name, path, config_dir=None)
    run.write_config(dump_config(cfg))
    env = make_vector_env(cfg.harness, 1, seed=0)
    try:
        obs_space, act_space = env.single_observation_space, env.single_action_space
    finally:
        env.close()
    manager = CheckpointManager(run.checkpoints_dir, keep=10)
    for it in iterations:
        torch.manual_seed(seed + it)
        policy = build_policy(cfg, obs_space, act_space)
        if policy.obs_norm is not None:  # statistics far from (0, 1): a graph without them would be far off
            for mod in policy.obs_norm.modules():
                if hasattr(mod, "mean") and isinstance(mod.mean, torch.Tensor):
                    shape = mod.mean.shape
                    mod.update(np.full(shape, 0.5), np.full(shape, 4.0), 1000)
        if hasattr(policy.agent, "explore_uniform"):
            policy.agent.explore_uniform.fill_(0.0)
        if hasattr(policy.agent, "epsilon"):
            policy.agent.epsilon.fill_(0.05)
        manager.save(it, {"policy": policy.state_dict(), "iteration": it, "env_steps": 16 * it, "policy_version": it})
    return run


@pytest.fixture
def make_run(tmp_path):
    counter = iter(range(1000))

    def make(env: str = "cartpole", iterations=(1,), **kw):
        cfg = run_config(env, **kw)
        return write_run(tmp_path / f"run{next(counter)}", cfg, iterations)

    return make
