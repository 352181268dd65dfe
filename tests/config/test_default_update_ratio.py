"""Default kwargs learn as much from each env step whatever the env count (issue 12, item 4).

Users change ``envs_per_worker`` without retuning. With defaults sized per env (a fixed ``n_steps``
per env, a fixed number of minibatches) more envs meant fewer gradient steps per sample, and small
tasks learnt several times slower than with Stable-Baselines3's defaults. These tests pin the rule
the defaults follow instead: PPO's rollout is 1,024 env steps in total, split across the envs, in
minibatches of 64 samples for 10 epochs; DQN/SAC make one gradient step per ``train_freq``
transitions in total (SB3's single-env ratio).
"""

from __future__ import annotations

import pytest

from polar.config.base import validate
from polar.config.ppo import PPOKwargs
from polar.config.run import RunConfig


def _ppo_iterations(tmp_path, num_envs: int, kwargs: dict | None = None) -> list[dict]:
    seen: list[dict] = []
    from polar.trainers.build import compose
    from polar.trainers.run_dir import RunDir

    cfg = validate(RunConfig, {
        "harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "ppo", "kwargs": kwargs or {}},
        "distribution": {"envs_per_worker": num_envs}, "total_env_steps": 2048,
        "logging": {"tensorboard": False, "checkpoint_freq": 0, "progress_bar": False}, "eval": {"at_end": False},
    })
    compose(cfg, RunDir.create("ratio", tmp_path / f"run{num_envs}"), on_iteration=seen.append).train()
    return seen


@pytest.mark.parametrize("num_envs", [1, 8])
def test_ppo_defaults_make_160_gradient_steps_per_1024_env_steps_at_any_env_count(tmp_path, num_envs):
    its = _ppo_iterations(tmp_path, num_envs)
    assert [m["env_steps"] for m in its] == [1024, 2048]  # n_steps = 1024 / num_envs per env
    assert [m["n_updates"] for m in its] == [160, 160]  # 1024 / 64 minibatches x 10 epochs


def test_ppo_explicit_n_steps_and_num_minibatches_keep_their_per_env_meaning(tmp_path):
    its = _ppo_iterations(tmp_path, 8, {"n_steps": 128, "num_minibatches": 4, "n_epochs": 4})
    assert [m["env_steps"] for m in its] == [1024, 2048] and [m["n_updates"] for m in its] == [16, 16]
    assert PPOKwargs(rollout_samples=256).steps_per_env(3) == 86  # rounded up: every sample is collected
    assert PPOKwargs(n_steps=32, rollout_samples=256).steps_per_env(3) == 32  # n_steps, when set, wins


def _off_policy_updates(tmp_path, algo: str, num_envs: int, kwargs: dict) -> int:
    from polar.trainers.build import compose
    from polar.trainers.run_dir import RunDir

    env = "CartPole-v1" if algo == "dqn" else "Pendulum-v1"
    cfg = validate(RunConfig, {
        "harness": {"type": "gymnasium", "id": env}, "total_env_steps": 480,
        "policy": {"type": algo, "kwargs": {"learning_starts": 0, "batch_size": 8, "buffer_size": 1000,
                                            "save_replay_buffer": False, **kwargs}},
        "agent": {"type": "mlp", "hidden_sizes": [16]}, "distribution": {"envs_per_worker": num_envs},
        "logging": {"tensorboard": False, "checkpoint_freq": 0, "progress_bar": False}, "eval": {"at_end": False},
    })
    trainer = compose(cfg, RunDir.create(algo, tmp_path / f"{algo}{num_envs}_{kwargs.get('gradient_steps')}"))
    res = trainer.train()
    assert res["env_steps"] == 480
    return trainer.learner.algorithm.n_updates


@pytest.mark.parametrize("algo, train_freq", [("dqn", 4), ("sac", 1)])
@pytest.mark.parametrize("num_envs", [1, 4])
def test_off_policy_defaults_make_one_gradient_step_per_train_freq_transitions(tmp_path, algo, train_freq, num_envs):
    # 480 transitions, training from the first phase: 480 / train_freq updates at 1 env and at 4
    assert _off_policy_updates(tmp_path, algo, num_envs, {}) == 480 // train_freq


def test_off_policy_explicit_gradient_steps_count_per_phase(tmp_path):
    assert _off_policy_updates(tmp_path, "dqn", 4, {"gradient_steps": 1}) == 480 // 16  # SB3's meaning
    assert _off_policy_updates(tmp_path, "dqn", 4, {"gradient_steps": -1}) == 480  # one per transition


def _appo_iterations(tmp_path, num_envs: int) -> list[dict]:
    from polar.trainers.build import compose
    from polar.trainers.run_dir import RunDir

    seen: list[dict] = []
    cfg = validate(RunConfig, {
        "harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "appo"},
        "distribution": {"envs_per_worker": num_envs}, "total_env_steps": 1024,
        "logging": {"tensorboard": False, "checkpoint_freq": 0, "progress_bar": False}, "eval": {"at_end": False},
    })
    compose(cfg, RunDir.create("appo", tmp_path / f"appo{num_envs}"), on_iteration=seen.append).train()
    return seen


@pytest.mark.parametrize("num_envs", [1, 8])
def test_appo_defaults_make_2_gradient_steps_per_64_env_steps_at_any_env_count(tmp_path, num_envs):
    # minibatches of 64 over each fragment (64 steps per env), two epochs: the ratio does not fall with envs
    its = _appo_iterations(tmp_path, num_envs)
    assert its[-1]["env_steps"] == 1024
    assert sum(m["n_updates"] for m in its) == 2 * 1024 // 64
