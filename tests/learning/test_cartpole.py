"""PPO solves CartPole-v1: 100-episode mean return >= 475 within 150k env steps, fixed seed."""

from __future__ import annotations

from pathlib import Path

from polar.config import load_config
from polar.trainers.build import compose
from polar.trainers.run_dir import RunDir

CARTPOLE = Path(__file__).resolve().parents[2] / "examples" / "cartpole_ppo.yaml"


def test_ppo_solves_cartpole_within_150k_steps(tmp_path):
    cfg = load_config(CARTPOLE, ["seed=0", "logging.tensorboard=false", "logging.checkpoint_freq=0"])
    res = compose(cfg, RunDir.create(cfg.name, tmp_path / "run")).train()
    assert res["stopped_early"], res  # the stop rule fired: the last 100 training episodes averaged >= 475
    assert res["episode_reward_mean"] >= 475 and res["env_steps"] <= 150_000
    assert res["eval"]["return_mean"] >= 475, res["eval"]  # and the deterministic policy holds up on fresh envs
