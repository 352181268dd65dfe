"""MuJoCo (``gymnasium[mujoco]``): HalfCheetah-v5 and Hopper-v5 are plain Gymnasium ids, so the examples need
no code. Short smoke runs of examples/mujoco through polar's own trainers (the full runs are the examples)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from polar.config import load_config
from polar.trainers.build import compose
from polar.trainers.run_dir import RunDir

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "mujoco"
QUIET = ["logging.tensorboard=false", "logging.checkpoint_freq=0", "eval.episodes=1"]


@pytest.fixture(autouse=True)
def _mujoco_log_in_tmp(tmp_path, monkeypatch):
    """MuJoCo writes its warnings to MUJOCO_LOG.TXT in the working directory: keep it out of the checkout."""
    monkeypatch.chdir(tmp_path)


def test_sac_runs_on_halfcheetah(tmp_path):
    cfg = load_config(EXAMPLES / "halfcheetah_sac.yaml", [
        *QUIET, "total_env_steps=300", "policy.kwargs.learning_starts=100", "policy.kwargs.batch_size=64",
        "policy.kwargs.save_replay_buffer=false", "agent.hidden_sizes=[32,32]", "harness.kwargs.max_episode_steps=100",
    ])
    res = compose(cfg, RunDir.create(cfg.name, tmp_path / "run")).train()
    assert res["env_steps"] >= 300
    assert res["eval"]["episodes"] == 1 and res["eval"]["lengths"] == [100]  # HalfCheetah never terminates
    assert np.isfinite(res["eval"]["return_mean"])


def test_ppo_runs_on_hopper(tmp_path):
    cfg = load_config(EXAMPLES / "hopper_ppo.yaml", [
        *QUIET, "total_env_steps=256", "policy.kwargs.n_steps=128", "policy.kwargs.batch_size=64",
        "policy.kwargs.n_epochs=1", "agent.hidden_sizes=[32,32]",
    ])
    res = compose(cfg, RunDir.create(cfg.name, tmp_path / "run")).train()
    assert res["iterations"] == 2 and res["env_steps"] == 256
    assert res["episodes"] >= 1  # a random Hopper falls over (terminates) within 128 steps
    assert np.isfinite(res["eval"]["return_mean"])
