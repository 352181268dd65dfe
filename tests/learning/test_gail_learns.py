"""GAIL recovers >= 80% of the expert's return on CartPole-v1, never seeing the env's reward: the shipped config
(examples/imitation/cartpole_gail.yaml, 100k env steps) on 20 episodes of a scripted balancing controller (return
500 per episode). The fast smoke test of the same path is tests/algorithms/test_gail.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from polar.config import load_config
from polar.trainers.build import compose
from polar.trainers.run_dir import RunDir
from tests.datasets.offline_data import cartpole_expert, play, write

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "imitation" / "cartpole_gail.yaml"


@pytest.mark.slow
def test_gail_recovers_80_percent_of_the_experts_cartpole_return(tmp_path):
    demos = play("CartPole-v1", 20, cartpole_expert, seed=0, max_steps=500)
    expert = float(np.mean([ep.rewards.sum() for ep in demos]))
    assert expert >= 450
    dataset = write(tmp_path / "cartpole-expert-v0", "CartPole-v1", demos)
    cfg = load_config(CONFIG, [f"policy.kwargs.dataset={dataset}", "seed=0", "logging.tensorboard=false",
                               "eval.every_n_iterations=0"])
    res = compose(cfg, RunDir.create(cfg.name, tmp_path / "run")).train()
    assert res["env_steps"] < 100_000 + 256  # the budget, rounded up to whole rollouts (32 steps x 8 envs)
    assert res["eval"]["return_mean"] >= 0.8 * expert, (res["eval"], expert)
