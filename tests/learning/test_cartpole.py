"""PPO solves CartPole-v1: 100-episode mean return >= 475 within 150k env steps, on each of three fixed seeds.

One seed is a lottery ticket: with RL Zoo's settings about one run in ten (polar's and SB3's alike,
docs/benchmarks.md "PPO vs Stable-Baselines3") peaks in the 440s and dips before it recovers, and which seed
does that moves with any last-bit change in the arithmetic (a BLAS, a tanh kernel). Three seeds, each within
the 150k budget, and their median within 100k (where one seed alone was held before), test the algorithm.
"""

from __future__ import annotations

from pathlib import Path

from polar.config import load_config
from polar.trainers.build import compose
from polar.trainers.run_dir import RunDir

CARTPOLE = Path(__file__).resolve().parents[2] / "examples" / "cartpole_ppo.yaml"


def test_ppo_solves_cartpole_within_150k_steps(tmp_path):
    steps = []
    for seed in (0, 1, 2):
        cfg = load_config(CARTPOLE, [f"seed={seed}", "total_env_steps=150000", "logging.tensorboard=false",
                                     "logging.checkpoint_freq=0"])
        res = compose(cfg, RunDir.create(cfg.name, tmp_path / f"run{seed}")).train()
        assert res["stopped_early"], (seed, res)  # the stop rule fired: the last 100 training episodes averaged >= 475
        assert res["episode_reward_mean"] >= 475 and res["env_steps"] <= 150_000, (seed, res)
        assert res["eval"]["return_mean"] >= 475, (seed, res["eval"])  # the deterministic policy holds on fresh envs
        steps.append(res["env_steps"])
    assert sorted(steps)[1] <= 100_000, steps
