"""GAIL and AIRL (polar.algorithms.gail): the discriminator learns to tell expert from policy transitions, the
reward each variant hands PPO has the documented sign and shape, the learner's state (discriminator, its optimizer,
its sampler) survives a checkpoint and ``polar resume``, and a dataset of another env is one line naming both spaces.
The threshold run (>= 80% of the expert's return on CartPole) is tests/learning/test_gail_learns.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from polar.algorithms.gail import (
    AIRLDiscriminator,
    GAILDiscriminator,
    GAILLearner,
    Transitions,
    discriminator_loss,
)
from polar.algorithms.ppo import PPOLearner
from polar.config import RunConfig, validate
from polar.config.gail import GAILKwargs
from polar.errors import ConfigError
from polar.models.policy import build_policy
from polar.trainers.build import build_trainer, create_run_dir
from polar.trainers.run_dir import RunDir
from tests.datasets.offline_data import cartpole_expert, play, write

ROOT = Path(__file__).resolve().parents[2]
OBS = gym.spaces.Box(-5.0, 5.0, (2,), np.float32)
ACT = gym.spaces.Discrete(2)


def _config(dataset: str | Path, algo: str = "gail", env_id: str = "CartPole-v1", total: int = 512,
            agent: dict | None = None, **kw) -> RunConfig:
    return validate(RunConfig, {
        "name": algo, "seed": 0, "harness": {"type": "gymnasium", "id": env_id},
        "agent": agent or {"type": "mlp", "hidden_sizes": [16, 16]},
        "policy": {"type": algo, "kwargs": {"dataset": str(dataset), "n_steps": 32, "batch_size": 64, "n_epochs": 2,
                                            "disc_hidden": [16], "disc_batch_size": 64, **kw}},
        "distribution": {"backend": "local", "rollout_workers": 0, "envs_per_worker": 4},
        "total_env_steps": total,
        "logging": {"tensorboard": False, "progress_bar": False, "checkpoint_freq": 2},
        "eval": {"episodes": 2, "num_envs": 1}})


def _toy(n: int, expert: bool, seed: int) -> Transitions:
    """Expert: obs near (1, 1), always action 1. Random: obs near (-1, 0), uniform actions."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.tensor([1.0, 1.0]) if expert else torch.tensor([-1.0, 0.0])
    obs = centre + 0.3 * torch.randn(n, 2, generator=g)
    actions = torch.ones(n, dtype=torch.int64) if expert else torch.randint(0, 2, (n,), generator=g)
    next_obs = obs + 0.1 * torch.randn(n, 2, generator=g)
    return Transitions(obs, actions, next_obs, torch.zeros(n), torch.full((n,), -0.69))


def _learner(make, expert: Transitions, **kw) -> GAILLearner:
    cfg = _config("unused", **kw)
    kwargs = cfg.policy.kwargs
    assert isinstance(kwargs, GAILKwargs)
    policy = build_policy(cfg, OBS, ACT)
    disc = make(OBS, ACT, expert.obs, list(kwargs.disc_hidden), kwargs.gamma)
    return GAILLearner(PPOLearner(policy.agent, kwargs, 1000), disc, expert, kwargs, seed=0)


@pytest.mark.parametrize("make", [GAILDiscriminator, AIRLDiscriminator])
def test_the_discriminator_separates_expert_from_random_transitions(make):
    torch.manual_seed(0)
    expert, random = _toy(512, True, 0), _toy(512, False, 1)
    learner = _learner(make, expert, disc_updates=200, disc_learning_rate=1e-2)
    with torch.no_grad():
        before = discriminator_loss(learner.discriminator.logits(expert), learner.discriminator.logits(random))
    stats = learner.train_discriminator(random)
    held_e, held_r = _toy(256, True, 2), _toy(256, False, 3)  # held out
    with torch.no_grad():
        e, r = learner.discriminator.logits(held_e), learner.discriminator.logits(held_r)
        after = discriminator_loss(e, r)
    assert float(after) < 0.2 < 0.6 < float(before), (float(before), float(after))
    assert float((e > 0).float().mean()) > 0.95 and float((r < 0).float().mean()) > 0.95
    assert stats["disc_steps"] == 200 and stats["disc_expert_accuracy"] > 0.9
    with torch.no_grad():  # the expert's transitions earn more reward than the random ones
        assert float(learner.discriminator.reward(held_e).mean()) > float(learner.discriminator.reward(held_r).mean())


def test_gail_reward_is_minus_log_one_minus_d():
    disc = GAILDiscriminator(OBS, ACT, torch.randn(64, 2), [8])
    t = _toy(32, False, 0)
    with torch.no_grad():
        logits, reward = disc.logits(t), disc.reward(t)
    d = torch.sigmoid(logits)
    assert reward.shape == (32,) == logits.shape
    torch.testing.assert_close(reward, -torch.log1p(-d), rtol=1e-4, atol=1e-5)
    assert bool((reward > 0).all())  # GAIL's reward is positive whatever D says


def test_airl_reward_is_the_shaped_f_and_its_logit_subtracts_log_pi():
    disc = AIRLDiscriminator(OBS, ACT, torch.randn(64, 2), [8], gamma=0.9)
    t = _toy(16, False, 0)
    with torch.no_grad():
        g = disc.g(disc.obs_features(t.obs)).squeeze(-1)
        h = disc.h(disc.obs_features(t.obs)).squeeze(-1)
        h_next = disc.h(disc.obs_features(t.next_obs)).squeeze(-1)
        torch.testing.assert_close(disc.reward(t), g + 0.9 * h_next - h)
        torch.testing.assert_close(disc.logits(t), g + 0.9 * h_next - h - t.log_pi)
        ended = Transitions(t.obs, t.actions, t.next_obs, torch.ones(16), t.log_pi)
        torch.testing.assert_close(disc.reward(ended), g - h)  # no h(s') past a terminal step
    assert disc.reward(t).shape == (16,)


class _RecordingPPO:
    """Stands in for PPOLearner: records the rewards its update is handed."""

    def __init__(self, agent):
        self.agent, self.rewards = agent, None

    def update(self, batch):
        self.rewards = batch.data.buffer.rewards.clone()
        return {}


def test_ppo_is_handed_the_discriminators_reward_not_the_envs():
    from polar.buffers.rollout_buffer import RolloutBuffer
    from polar.types import Batch, Fragment, Rollout

    T, N = 4, 2
    g = np.random.default_rng(0)
    z = np.zeros((T, N), np.float32)
    frag = Fragment(obs=g.normal(size=(T, N, 2)).astype(np.float32), actions=g.integers(0, 2, (T, N)),
                    log_probs=z - 0.69, values=z, rewards=z + 1, terminated=z, truncated=z, episode_starts=z,
                    trunc_values=z, last_values=np.zeros(N, np.float32))
    learner = _learner(GAILDiscriminator, _toy(64, True, 0), disc_updates=1)
    ppo = _RecordingPPO(learner.agent)
    learner.ppo = ppo
    out = learner.update(Batch(data=Rollout([frag], buffer=RolloutBuffer([frag])), env_steps=T * N))
    with torch.no_grad():
        expected = learner.discriminator.reward(Transitions(
            torch.as_tensor(frag.obs).reshape(-1, 2), torch.as_tensor(frag.actions).reshape(-1), None,
            torch.zeros(T * N))).reshape(T, N)
    torch.testing.assert_close(ppo.rewards, expected)
    assert out["env_reward_step_mean"] == 1.0 and out["disc_reward_mean"] == pytest.approx(float(expected.mean()))


def test_box_actions_are_clipped_and_scaled_to_the_bounds():
    disc = GAILDiscriminator(OBS, gym.spaces.Box(-2.0, 2.0, (1,), np.float32), torch.randn(8, 2), [8])
    a = disc.act_features(torch.tensor([[-2.0], [0.0], [2.0], [7.0]]))
    torch.testing.assert_close(a, torch.tensor([[-1.0], [0.0], [1.0], [1.0]]))


def test_the_learner_state_round_trips(tmp_path):
    expert, random = _toy(128, True, 0), _toy(128, False, 1)
    a = _learner(GAILDiscriminator, expert, disc_updates=5)
    a.train_discriminator(random)
    torch.save(a.state_dict(), tmp_path / "s.pt")
    b = _learner(GAILDiscriminator, expert, disc_updates=5)
    b.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    for (k, va), vb in zip(a.discriminator.state_dict().items(), b.discriminator.state_dict().values(), strict=True):
        torch.testing.assert_close(va, vb, msg=k)
    assert b.disc_steps == 5
    # the same next steps: optimizer moments and the minibatch sampler came back too
    a.train_discriminator(random)
    b.train_discriminator(random)
    for va, vb in zip(a.discriminator.parameters(), b.discriminator.parameters(), strict=True):
        torch.testing.assert_close(va, vb)


def _cartpole_dataset(path: Path, episodes: int = 2) -> Path:
    write(path, "CartPole-v1", play("CartPole-v1", episodes, cartpole_expert, max_steps=200))
    return path


@pytest.mark.parametrize("algo", ["gail", "airl"])
def test_a_run_trains_the_discriminator_and_resume_continues_it(tmp_path, algo):
    ds = _cartpole_dataset(tmp_path / "cartpole-expert-v0")
    cfg = _config(ds, algo, total=512)  # 4 iterations of 128 env steps
    res = build_trainer(cfg, create_run_dir(cfg, tmp_path / "run")).train()
    assert res["env_steps"] == 512
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["disc_steps"] for r in rows] == [4, 8, 12, 16]  # disc_updates per rollout
    assert all(np.isfinite(r["disc_loss"]) and r["env_reward_step_mean"] == 1.0 for r in rows)
    assert rows[-1]["disc_reward_mean"] != 1.0  # PPO saw the discriminator's reward, not CartPole's 1 per step
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "ckpt_00000004.pt", weights_only=True)
    disc = ckpt["learner"]["discriminator"]
    assert "obs_mean" in disc and ckpt["learner"]["disc_steps"] == 16

    build_trainer(cfg.model_copy(update={"total_env_steps": 768}), RunDir.open(tmp_path / "run"), resume=True).train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["disc_steps"] for r in rows] == [4, 8, 12, 16, 20, 24]  # continued from the checkpoint's 16


def test_a_dataset_of_another_env_is_one_line_naming_both_spaces(tmp_path):
    ds = _cartpole_dataset(tmp_path / "cartpole-expert-v0", episodes=1)
    cfg = _config(ds, "gail", env_id="Acrobot-v1")
    with pytest.raises(ConfigError) as e:
        build_trainer(cfg, create_run_dir(cfg, tmp_path / "run"))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("policy.kwargs.dataset: the dataset's observation_space is Box(")
    assert "(4,)" in msg and "(6,)" in msg and "but the env's is Box(" in msg, msg


def test_airl_refuses_a_recurrent_agent_naming_the_fix(tmp_path):
    ds = _cartpole_dataset(tmp_path / "cartpole-expert-v0", episodes=1)
    cfg = _config(ds, "airl", agent={"type": "lstm", "hidden_sizes": [16]})
    with pytest.raises(ConfigError, match=r"policy.type 'airl' reads log pi\(a\|s\) .* use agent.type: mlp"):
        build_trainer(cfg, create_run_dir(cfg, tmp_path / "run"))


@pytest.mark.parametrize("key", ["normalize_reward", "normalize_obs"])
def test_reward_and_obs_normalization_are_refused_naming_the_key(key):
    with pytest.raises(Exception, match=rf"{key}: .*set {key}: false"):
        _config("x.d", "gail", **{key: True})


def test_polar_run_cli_prints_the_space_mismatch_as_one_line(tmp_path):
    ds = _cartpole_dataset(tmp_path / "cartpole-expert-v0", episodes=1)
    config = tmp_path / "gail.yaml"
    config.write_text(json.dumps({"name": "g", "harness": {"type": "gymnasium", "id": "Pendulum-v1"},
                                  "policy": {"type": "gail", "kwargs": {"dataset": str(ds)}},
                                  "distribution": {"backend": "local", "rollout_workers": 0},
                                  "total_env_steps": 256, "logging": {"tensorboard": False}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--config", str(config), "--run-dir",
                        str(tmp_path / "run"), "--no-progress"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0
    lines = [line for line in p.stderr.splitlines() if "policy.kwargs.dataset" in line]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "observation_space is Box(" in lines[0] and "(3,)" in lines[0] and "(4,)" in lines[0], lines[0]

