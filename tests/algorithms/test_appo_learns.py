"""APPO learns CartPole through the same trainer loop on the local backend (worker processes, async)."""

import pytest

from polar.config import RunConfig, validate
from polar.trainers.build import compose
from polar.trainers.run_dir import RunDir


@pytest.mark.slow
def test_appo_learns_cartpole_on_the_local_backend(tmp_path):
    cfg = validate(RunConfig, {
        "harness": {"type": "gymnasium", "id": "CartPole-v1"},
        "policy": {"type": "appo", "kwargs": {"n_steps": 64, "learning_rate": 1e-3, "n_epochs": 2, "batch_size": 256}},
        "distribution": {"backend": "local", "rollout_workers": 2, "envs_per_worker": 4},
        "total_env_steps": 400_000,
        "stop_reward": 475,
        "logging": {"checkpoint_freq": 0, "tensorboard": False, "progress_bar": False},
        "eval": {"episodes": 5, "num_envs": 5},
    })
    result = compose(cfg, RunDir.create("appo", tmp_path / "run")).train()
    assert result["stopped_early"] and result["episode_reward_mean"] >= 475
    assert result["eval"]["return_mean"] >= 400
