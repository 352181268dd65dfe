"""``harness.preset: atari``: the standard preprocessing on a real ALE Breakout (ale-py ships the ROMs), the
Nature CNN, and a two-iteration PPO run of examples/atari/breakout_ppo.yaml through polar's own trainer."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from polar.config import load_config
from polar.config.base import validate
from polar.config.harness import GymnasiumHarnessConfig
from polar.errors import ConfigError
from polar.harness import make_env, make_vector_env
from polar.harness.atari import ClipReward
from polar.models.encoders import NatureCNN, build_encoder
from polar.trainers.build import compose
from polar.trainers.run_dir import RunDir

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BREAKOUT = "ale_py:ALE/Breakout-v5"


def _breakout(**kw) -> gym.Env:
    return make_env(GymnasiumHarnessConfig(id=BREAKOUT, preset="atari", **kw))


def test_preprocessing_gives_a_stack_of_four_84x84_grey_frames():
    env = _breakout()
    obs, _ = env.reset(seed=0)
    # the 4-frame stack, channels last (polar's image layout): (84, 84, 4) uint8
    assert env.observation_space.shape == (84, 84, 4) and env.observation_space.dtype == np.uint8
    assert obs.shape == (84, 84, 4) and obs.dtype == np.uint8
    for _ in range(8):
        obs, *_ = env.step(env.action_space.sample())
    assert obs.shape == (84, 84, 4) and obs.any()  # real grey frames, not padding zeros
    assert not np.array_equal(obs[..., 0], obs[..., -1])  # the frames are different moments
    env.close()
    vec = make_vector_env(GymnasiumHarnessConfig(id=BREAKOUT, preset="atari"), 2, seed=0)
    assert vec.reset(seed=0)[0].shape == (2, 84, 84, 4)
    vec.close()


def test_episodic_life_ends_the_episode_on_a_lost_life_not_the_game():
    env = _breakout()
    env.reset(seed=0)
    ale = env.unwrapped.ale
    start_lives = ale.lives()
    for _ in range(2000):
        _, reward, terminated, truncated, _ = env.step(0)  # NOOP after the fire reset: the ball is lost
        assert reward in (0.0, 1.0)
        if terminated or truncated:
            break
    assert terminated and not truncated
    assert ale.lives() == start_lives - 1 > 0  # one life gone, the game goes on
    env.reset()
    assert ale.lives() == start_lives - 1  # reset carried on from the lost life instead of a new game
    env.close()


def test_rewards_are_clipped_to_their_sign():
    env = ClipReward(gym.make("CartPole-v1"))
    assert [env.reward(r) for r in (7.0, 4.0, 1.0, 0.0, -3.5)] == [1.0, 1.0, 1.0, 0.0, -1.0]
    raw = _breakout(atari={"clip_reward": False})
    assert not any(isinstance(e, ClipReward) for e in _wrappers(raw))
    assert any(isinstance(e, ClipReward) for e in _wrappers(_breakout()))


def _wrappers(env: gym.Env) -> list[gym.Env]:
    out = []
    while isinstance(env, gym.Wrapper):
        out.append(env)
        env = env.env
    return out


def test_nature_cnn_has_the_papers_shapes():
    space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    cnn = NatureCNN(space)
    assert cnn.out_dim == 64 * 7 * 7
    assert [m.kernel_size for m in cnn.net if isinstance(m, torch.nn.Conv2d)] == [(8, 8), (4, 4), (3, 3)]
    enc, out = build_encoder(space, [512], "relu", [16, 32], "nature")
    x = torch.randint(0, 256, (3, 84, 84, 4), dtype=torch.uint8)
    assert out == 512 and enc(x).shape == (3, 512)
    with pytest.raises(ConfigError, match=r"agent\.cnn_arch"):
        NatureCNN(gym.spaces.Box(0, 255, (16, 16, 3), np.uint8))


def test_bad_preset_input_is_one_named_error():
    with pytest.raises(ConfigError, match="preset"):
        validate(GymnasiumHarnessConfig, {"id": BREAKOUT, "preset": "atarii"})
    with pytest.raises(ConfigError, match=r"harness\.kwargs\.frameskip"):
        _breakout(kwargs={"frameskip": 4})
    with pytest.raises(ConfigError, match="ale_py env"):
        make_env(GymnasiumHarnessConfig(id="CartPole-v1", preset="atari"))
    with pytest.raises(ConfigError, match="fire_reset"):
        make_env(GymnasiumHarnessConfig(id="ale_py:ALE/Freeway-v5", preset="atari"))  # no FIRE action


def test_ppo_with_the_nature_cnn_runs_two_iterations_on_breakout(tmp_path):
    cfg = load_config(EXAMPLES / "atari" / "breakout_ppo.yaml", [
        "logging.tensorboard=false", "logging.checkpoint_freq=0", "distribution.envs_per_worker=2",
        "policy.kwargs.n_steps=16", "policy.kwargs.batch_size=32", "policy.kwargs.n_epochs=1",
        "total_env_steps=64", "eval.episodes=1",
    ])
    trainer = compose(cfg, RunDir.create(cfg.name, tmp_path / "run"))
    res = trainer.train()
    assert res["iterations"] == 2 and res["env_steps"] == 64
    convs = [m for m in trainer.learner.parts.policy.agent.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.kernel_size for c in convs] == [(8, 8), (4, 4), (3, 3)]  # shared trunk: one Nature CNN
    assert res["eval"]["episodes"] == 1 and np.isfinite(res["eval"]["return_mean"])
