"""CQL (``policy: {type: cql}``): its losses, learning from a small dataset (Discrete and Box actions), bad input.

What is measured: the deterministic evaluation return (10 episodes). CartPole-v1: 500 = perfect, uniform random
~22. Pendulum-v1 (200 steps): 0 = best, a uniform random policy gets about -1200."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from polar.algorithms.cql import continuous_cql_gap, discrete_cql_gap, double_q_target, uniform_log_density
from polar.config import RunConfig, validate
from polar.errors import ConfigError
from polar.trainers.build import build_trainer, create_run_dir
from tests.datasets.offline_data import cartpole_expert, offline_config, pendulum_controller, play, write


def train(cfg, path):
    return build_trainer(cfg, create_run_dir(cfg, path)).train()


# ---- the losses ----------------------------------------------------------------------------------------------

def test_discrete_gap_is_logsumexp_minus_the_data_q_and_pushes_the_data_action_up():
    q = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.5, 0.5]], requires_grad=True)
    a = torch.tensor([1, 0])
    gap = discrete_cql_gap(q, a)
    expected = ((math.log(math.e + math.e**2 + 1) - 2.0) + (math.log(3 * math.exp(0.5)) - 0.5)) / 2
    assert gap.item() == pytest.approx(expected, rel=1e-6) and gap.item() > 0
    gap.backward()
    g = q.grad
    assert g[0, 1] < 0 and g[1, 0] < 0  # minimizing raises Q of the data's actions
    assert (g[0, [0, 2]] > 0).all() and (g[1, 1:] > 0).all()  # and lowers the others


def test_double_q_target_values_the_online_argmax_with_the_target_network():
    online = torch.tensor([[0.0, 5.0], [3.0, 1.0]])
    target = torch.tensor([[7.0, 2.0], [4.0, 9.0]])
    y = double_q_target(torch.tensor([1.0, 1.0]), torch.tensor([0.0, 1.0]), online, target, 0.5)
    assert y.tolist() == [1.0 + 0.5 * 2.0, 1.0]  # argmax online = 1 -> target 2.0; the terminal one does not bootstrap


def test_continuous_gap_importance_weights_each_sample_by_its_density():
    d, k = 2, 6
    q_data = torch.tensor([1.0])
    q_sampled = torch.full((1, k), 3.0)
    log_density = torch.cat([torch.full((1, 3), uniform_log_density(d)), torch.full((1, 3), -1.0)], 1)
    gap = continuous_cql_gap(q_data, q_sampled, log_density)
    manual = math.log(3 * math.exp(3.0 - d * math.log(0.5)) + 3 * math.exp(3.0 + 1.0)) - 1.0
    assert gap.item() == pytest.approx(manual, rel=1e-6)
    assert uniform_log_density(3) == pytest.approx(3 * math.log(0.5))


# ---- learning --------------------------------------------------------------------------------------------------

def test_discrete_cql_learns_cartpole_from_expert_data(tmp_path):
    """4 episodes (200 steps) of the scripted controller; measured 422 after 1,000 steps."""
    ds = write(tmp_path / "cartpole-expert-v0", "CartPole-v1", play("CartPole-v1", 4, cartpole_expert, max_steps=200))
    res = train(offline_config("CartPole-v1", "cql", ds, 1000, batch_size=64), tmp_path / "cql")
    assert res["env_steps"] == 0 and res["eval"]["gradient_steps"] == 1000
    assert res["eval"]["return_mean"] >= 150, res["eval"]
    import json

    rows = [json.loads(line) for line in (tmp_path / "cql" / "metrics.jsonl").read_text().splitlines()]
    assert all(k in rows[-1] for k in ("td_loss", "cql_gap", "critic_loss", "q_mean"))
    assert rows[-1]["cql_gap"] < rows[0]["cql_gap"]  # the data's actions come to dominate the logsumexp


def test_discrete_cql_agent_is_dqns_q_network_and_acts_greedily(tmp_path):
    from polar.models.off_policy import QNetworkAgent

    ds = write(tmp_path / "cartpole-expert-v0", "CartPole-v1", play("CartPole-v1", 1, cartpole_expert, max_steps=50))
    cfg = offline_config("CartPole-v1", "cql", ds, 10, batch_size=16)
    trainer = build_trainer(cfg, create_run_dir(cfg, tmp_path / "cql"))
    trainer.train()
    agent = trainer.learner.parts.policy.agent
    assert isinstance(agent, QNetworkAgent)
    obs = torch.randn(64, 4)
    sampled, _, info = agent.act(obs, None, deterministic=False)  # no epsilon, no uniform warm-up
    assert torch.equal(sampled, info["q_values"].argmax(-1))


def _data_action_margin(tmp_path, name, ds, **kwargs) -> tuple[float, float]:
    """Over the dataset's states, after 200 steps: critic 0's mean margin Q(s, a_data) - mean_10 Q(s, a_uniform),
    and how often it is positive."""
    from polar.datasets.minari import load_dataset

    cfg = offline_config("Pendulum-v1", "cql", ds, 200, batch_size=64, **kwargs)
    cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"at_end": False})})
    trainer = build_trainer(cfg, create_run_dir(cfg, tmp_path / name))
    trainer.train()
    data = load_dataset(ds)
    obs, act = torch.as_tensor(data.obs), torch.as_tensor(data.actions).float()
    critic = trainer.learner.algorithm.critics[0]
    torch.manual_seed(0)
    with torch.no_grad():
        q_data = critic(obs, act)
        q_uniform = torch.stack([critic(obs, torch.rand_like(act) * 4 - 2) for _ in range(10)], 1).mean(1)
    return float((q_data - q_uniform).mean()), float((q_data > q_uniform).float().mean())


def test_continuous_cql_ranks_the_datasets_actions_above_unseen_ones(tmp_path):
    """Box CQL's critics learn Q lower on actions the dataset does not take: 5 episodes of a Pendulum swing-up
    controller (returns about -140; uniform random ~-1200). Measured after 200 steps (seed 0): a margin of 0.42 with
    CQL (the data's action above the uniform mean on 0.90 of the states), 0.13 without the penalty
    (conservative_weight: 0, i.e. offline SAC with d3rlpy's deterministic backup)."""
    ds = write(tmp_path / "pendulum-ctrl-v0", "Pendulum-v1", play("Pendulum-v1", 5, pendulum_controller, max_steps=200))
    cql = _data_action_margin(tmp_path, "cql", ds)
    sac = _data_action_margin(tmp_path, "sac", ds, conservative_weight=0.0)
    assert cql[1] >= 0.75 and cql[0] > 2 * sac[0], (cql, sac)


# ---- checkpoints and other commands ----------------------------------------------------------------------------

def test_a_cql_run_resumes_and_polar_collect_reads_it(tmp_path):
    from polar.cli.main import main

    ds = write(tmp_path / "pendulum-random-v0", "Pendulum-v1", play("Pendulum-v1", 2, None, max_steps=50))
    cfg = offline_config("Pendulum-v1", "cql", ds, 40, batch_size=16, steps_per_iteration=20, n_action_samples=2)
    cfg = cfg.model_copy(update={"logging": cfg.logging.model_copy(update={"checkpoint_freq": 1})})
    train(cfg, tmp_path / "cql")
    assert main(["resume", str(tmp_path / "cql"), "-o", "policy.kwargs.gradient_steps=60"]) == 0
    out = tmp_path / "pendulum-cql-v0"
    assert main(["collect", str(tmp_path / "cql"), "--episodes", "1", "--out", str(out)]) == 0
    import json

    rows = [json.loads(line) for line in (tmp_path / "cql" / "metrics.jsonl").read_text().splitlines()]
    assert [r["n_updates"] for r in rows] == [20, 40, 60]
    assert json.loads((out / "data" / "metadata.json").read_text())["algorithm_id"] == "polar-cql"


# ---- bad input ---------------------------------------------------------------------------------------------------

def _cfg(tmp_path, **kwargs):
    return {"name": "c", "harness": {"type": "gymnasium", "id": "CartPole-v1"},
            "policy": {"type": "cql", "kwargs": {"dataset": str(tmp_path / "none-v0"), **kwargs}},
            "distribution": {"backend": "local"}}


@pytest.mark.parametrize("kwargs, match", [
    ({"conservative_weigth": 1.0}, r"conservative_weigth"),
    ({"conservative_weight": -1.0}, r"conservative_weight"),
    ({"n_action_samples": 0}, r"n_action_samples"),
    ({"ent_coef": "learned"}, r"ent_coef"),
])
def test_bad_cql_kwargs_name_the_key(tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        validate(RunConfig, _cfg(tmp_path, **kwargs))


def test_cql_needs_a_dataset(tmp_path):
    cfg = _cfg(tmp_path)
    del cfg["policy"]["kwargs"]["dataset"]
    with pytest.raises(ConfigError, match=r"dataset"):
        validate(RunConfig, cfg)


def test_a_missing_dataset_and_an_lstm_agent_fail_before_training(tmp_path):
    cfg = validate(RunConfig, _cfg(tmp_path))
    with pytest.raises(ConfigError, match=r"dataset 'none-v0' not found|none-v0.*not found"):
        train(cfg, tmp_path / "a")
    ds = write(tmp_path / "cartpole-expert-v0", "CartPole-v1", play("CartPole-v1", 1, cartpole_expert, max_steps=20))
    bad = validate(RunConfig, {**_cfg(tmp_path), "agent": {"type": "lstm"},
                               "policy": {"type": "cql", "kwargs": {"dataset": str(ds)}}})
    with pytest.raises(ConfigError, match=r"agent.type 'lstm': policy.type cql builds its own networks"):
        train(bad, tmp_path / "b")


def test_cql_refuses_an_unbounded_box_by_name():
    from polar.models.off_policy import build_off_policy_agent

    cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "Pendulum-v1"},
                               "policy": {"type": "cql", "kwargs": {"dataset": "x-v0"}}})
    box = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    with pytest.raises(ConfigError, match=r"policy.type cql takes Discrete actions or a Box with finite bounds"):
        build_off_policy_agent(cfg, gym.spaces.Box(-1, 1, (3,), np.float32), box)
