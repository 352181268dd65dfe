"""DQN learns CartPole-v1 and SAC learns Pendulum-v1 (fixed seeds, RL Zoo hyperparameters).

All four are slow-only (`pytest -m slow`): shortened versions (smaller networks, fewer steps) that must still
clearly beat a random policy (CartPole ~22, Pendulum about -1200 to -1500), and RL Zoo's full settings that must
solve the task. The default suite keeps DQN's and SAC's paths by fast tests: tests/algorithms/test_dqn.py and
test_sac.py (the updates, targets, entropy tuning), tests/trainers/test_off_policy.py (whole runs: metrics,
checkpoints, replay, resume, two workers).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.config import load_config
from polar.trainers.build import compose
from polar.trainers.run_dir import RunDir

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUIET = ["logging.tensorboard=false", "logging.checkpoint_freq=0", "policy.kwargs.save_replay_buffer=false"]


def _train(tmp_path, example: str, overrides: list[str]) -> dict:
    cfg = load_config(EXAMPLES / example, [*QUIET, *overrides])
    return compose(cfg, RunDir.create(cfg.name, tmp_path / "run")).train()


@pytest.mark.slow  # ~15 s of the default suite on CI's 2 cores: trains to a threshold
def test_dqn_learns_cartpole_in_30k_steps(tmp_path):
    res = _train(tmp_path, "cartpole_dqn.yaml", ["seed=0", "total_env_steps=30000", "agent.hidden_sizes=[64,64]"])
    assert res["episode_reward_mean"] >= 80, res  # training episodes, epsilon 0.04
    assert res["eval"]["return_mean"] >= 100, res["eval"]  # greedy policy on fresh envs: 4x+ a random one


@pytest.mark.slow  # ~37 s of the default suite on CI's 2 cores: trains to a threshold
def test_sac_learns_pendulum_in_7k_steps(tmp_path):
    res = _train(tmp_path, "pendulum_sac.yaml", ["seed=0", "total_env_steps=7000", "agent.hidden_sizes=[64,64]"])
    assert res["eval"]["return_mean"] >= -400, res["eval"]


@pytest.mark.slow
def test_dqn_solves_cartpole_with_rl_zoo_settings(tmp_path):
    res = _train(tmp_path, "cartpole_dqn.yaml", ["seed=0"])
    assert res["eval"]["return_mean"] >= 475, res["eval"]


@pytest.mark.slow
def test_sac_solves_pendulum_with_rl_zoo_settings(tmp_path):
    res = _train(tmp_path, "pendulum_sac.yaml", ["seed=0", "total_env_steps=10000"])
    assert res["eval"]["return_mean"] >= -250, res["eval"]
