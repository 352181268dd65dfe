"""A stochastic evaluation samples its actions from a fork of torch's global generator: what training draws
next does not depend on how often, or whether, the run is evaluated."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from polar.config import RunConfig, validate
from polar.trainers.build import build_trainer
from polar.trainers.evaluation import evaluate_policy
from polar.trainers.run_dir import RunDir


def _cfg(every_n_iterations: int) -> Any:
    return validate(RunConfig, {
        "harness": {"type": "gymnasium", "id": "CartPole-v1"}, "seed": 3, "total_env_steps": 1536,
        "distribution": {"envs_per_worker": 2},
        "policy": {"type": "ppo", "kwargs": {"n_steps": 64, "batch_size": 64, "n_epochs": 2}},
        "eval": {"deterministic": False, "every_n_iterations": every_n_iterations, "episodes": 4, "at_end": False},
        "logging": {"tensorboard": False, "progress_bar": False}})


def _selfplay_cfg(every_n_iterations: int) -> Any:
    return validate(RunConfig, {
        "harness": {"type": "pettingzoo", "id": "pettingzoo.classic.tictactoe_v3"}, "seed": 3,
        "policy": {"type": "ppo", "kwargs": {"n_steps": 32, "batch_size": 128, "n_epochs": 2}},
        "distribution": {"envs_per_worker": 4}, "total_env_steps": 600,
        "eval": {"deterministic": False, "every_n_iterations": every_n_iterations, "episodes": 4, "at_end": False},
        "logging": {"tensorboard": False, "checkpoint_freq": 0, "progress_bar": False}})


def _options_cfg(every_n_iterations: int) -> Any:
    return validate(RunConfig, {
        "harness": {"type": "gymnasium", "id": "tests.hierarchy.envs:HierTick-v0"}, "seed": 3,
        "agent": {"type": "mlp", "hidden_sizes": [16]},
        "policy": {"type": "hierarchical", "kwargs": {
            "option_steps": 4, "skills": [{"name": "tick", "subgoal": "tick"}, {"name": "free", "reward": "extrinsic"}],
            "ppo": {"n_steps": 16, "batch_size": 32, "n_epochs": 2}}},
        "distribution": {"envs_per_worker": 4}, "total_env_steps": 256,
        "eval": {"deterministic": False, "every_n_iterations": every_n_iterations, "episodes": 4, "num_envs": 2,
                 "at_end": False},
        "logging": {"tensorboard": False, "checkpoint_freq": 0, "progress_bar": False}})


def _tensors(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    if isinstance(state, dict):
        return {k: v for key, value in state.items() for k, v in _tensors(value, f"{prefix}/{key}").items()}
    if isinstance(state, (list, tuple)):
        return {k: v for i, value in enumerate(state) for k, v in _tensors(value, f"{prefix}/{i}").items()}
    return {}


def _trained(cfg: Any, path: Any) -> dict[str, torch.Tensor]:
    """The learner's tensors (weights and optimizer state) after training ``cfg``."""
    with build_trainer(cfg, RunDir.create("x", path)) as loop:
        loop.train()
        return _tensors(loop.learner.state_dict())


@pytest.mark.parametrize("kind", ["gymnasium", "pettingzoo", "hierarchical"])
def test_stochastic_evaluations_during_training_leave_the_training_run_unchanged(tmp_path, kind):
    """A run evaluated with sampled actions after every iteration trains exactly as one never evaluated."""
    make = {"gymnasium": _cfg, "pettingzoo": _selfplay_cfg, "hierarchical": _options_cfg}[kind]
    plain, evaluated = _trained(make(0), tmp_path / "plain"), _trained(make(1), tmp_path / "evaluated")
    assert plain and plain.keys() == evaluated.keys()
    assert all(torch.equal(plain[k], evaluated[k]) for k in plain)


def test_a_stochastic_evaluation_moves_no_one_elses_random_stream(tmp_path):
    """It samples from a fork of the global stream: the numbers it gave when it drew from that stream, and
    the stream where it stood."""
    with build_trainer(_cfg(0), RunDir.create("x", tmp_path / "run")) as loop:
        policy, harness = loop.learner.parts.policy, loop.learner.parts.cfg.harness
        torch.manual_seed(0)
        start = torch.get_rng_state()
        first = evaluate_policy(policy, harness, episodes=6, seed=5, deterministic=False)
        assert torch.equal(torch.get_rng_state(), start)
        second = evaluate_policy(policy, harness, episodes=6, seed=5, deterministic=False)
        torch.rand(1000)  # training draws in between
        third = evaluate_policy(policy, harness, episodes=6, seed=5, deterministic=False)
    assert first == second
    assert third != first  # sampled actions, from where the global stream stands


def test_polar_eval_with_sampled_actions_gives_the_same_episodes_for_the_same_seed(tmp_path):
    from polar.trainers.build import evaluate_run

    with build_trainer(_cfg(0), RunDir.create("x", tmp_path / "run")) as loop:
        loop.train()
    run = tmp_path / "run"
    results = [evaluate_run(run, episodes=6, seed=seed, stochastic=True)[2] for seed in (7, 7, 8)]
    first, again, other = ({k: v for k, v in r.items() if k != "written"} for r in results)
    assert first == again
    assert first["lengths"] != other["lengths"]
