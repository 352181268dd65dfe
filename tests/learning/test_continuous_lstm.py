"""Continuous-action PPO and recurrent PPO learn what they must (tasks in tests/learning/envs.py)."""

from __future__ import annotations

from tests.learning.conftest import train_in_process


def test_gaussian_ppo_learns_continuous_reaching(tmp_path):
    res, _ = train_in_process(tmp_path, {
        "name": "reach", "seed": 0, "total_env_steps": 30_000,
        "harness": {"type": "gymnasium", "id": "PolarReachTarget-v0"},
        "agent": {"type": "mlp", "hidden_sizes": [64, 64]},
        "policy": {"type": "ppo", "kwargs": {"n_steps": 64, "num_minibatches": 4, "n_epochs": 10, "learning_rate": 1e-3,
                                            "gamma": 0.9, "gae_lambda": 0.9, "ent_coef": 0.0}},
        "distribution": {"envs_per_worker": 8},
        "logging": {"tensorboard": False, "checkpoint_freq": 0},
        "eval": {"episodes": 50},
    })
    # random actions score about -6.6 per episode here; moving straight to the target about -1.3
    assert res["eval"]["return_mean"] > -2.0, res["eval"]


def test_lstm_agent_remembers_the_cue(tmp_path):
    res, _ = train_in_process(tmp_path, {
        "name": "cue", "seed": 0, "total_env_steps": 40_000,
        "harness": {"type": "gymnasium", "id": "PolarCueMemory-v0"},
        "agent": {"type": "lstm", "hidden_sizes": [32], "lstm_hidden_size": 32},
        "policy": {"type": "ppo", "kwargs": {"n_steps": 20, "num_minibatches": 2, "n_epochs": 4, "learning_rate": 3e-3,
                                            "gamma": 0.9, "gae_lambda": 0.95, "ent_coef": 0.01}},
        "distribution": {"envs_per_worker": 16},
        "stop_reward": 0.97,
        "logging": {"tensorboard": False, "checkpoint_freq": 0},
        "eval": {"episodes": 100},
    })
    # without memory the answer is a coin flip (50%): only the LSTM state can carry the cue
    assert res["eval"]["success_rate"] >= 0.95, res["eval"]
