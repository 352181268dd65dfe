"""Robustness wrappers: each changes what it says, and the same episode seed gives the same perturbation."""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest

from polar.errors import ConfigError
from polar.evaluation.wrappers import (
    ActionDelay,
    ActionRepeat,
    DistractorFeatures,
    HeldOutSeeds,
    ObservationNoise,
    StickyActions,
)


class Recorder(gym.Env):
    """Observation = the step count (3 copies); records every executed action; ends after ``horizon`` steps."""

    def __init__(self, horizon: int = 1000, dict_obs: bool = False) -> None:
        box = gym.spaces.Box(-5.0, 5.0, (3,), np.float32)
        self.observation_space = gym.spaces.Dict({"x": box, "n": gym.spaces.Discrete(9)}) if dict_obs else box
        self.action_space = gym.spaces.Discrete(4)
        self.horizon, self.dict_obs, self.executed, self.t = horizon, dict_obs, [], 0

    def _obs(self):
        x = np.zeros(3, np.float32)
        return {"x": x, "n": 2} if self.dict_obs else x

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.executed.append(int(action))
        self.t += 1
        return self._obs(), 1.0, self.t >= self.horizon, False, {}


def test_observation_noise_is_seeded_per_episode_and_clipped():
    env = ObservationNoise(Recorder(), std=0.5)
    a = [env.reset(seed=7)[0]] + [env.step(0)[0] for _ in range(50)]
    b = [env.reset(seed=7)[0]] + [env.step(0)[0] for _ in range(50)]
    c = [env.reset(seed=8)[0]] + [env.step(0)[0] for _ in range(50)]
    assert np.array_equal(np.stack(a), np.stack(b)) and not np.array_equal(np.stack(a), np.stack(c))
    assert np.std(np.stack(a)) == pytest.approx(0.5, rel=0.25)
    big = ObservationNoise(Recorder(), std=100.0)
    obs, _ = big.reset(seed=1)
    assert np.all(np.abs(obs) <= 5.0) and obs.dtype == np.float32
    d = ObservationNoise(Recorder(dict_obs=True), std=0.5)
    obs, _ = d.reset(seed=1)
    assert obs["n"] == 2 and np.any(obs["x"] != 0)


def test_action_delay_executes_the_action_chosen_steps_earlier():
    inner = Recorder()
    env = ActionDelay(inner, steps=2)
    env.reset(seed=0)
    for a in (1, 2, 3, 1):
        env.step(a)
    assert inner.executed == [0, 0, 1, 2]
    env.reset(seed=0)  # a new episode starts with no-ops again
    env.step(3)
    assert inner.executed[-1] == 0


def test_action_repeat_sums_rewards_and_stops_at_the_end():
    inner = Recorder(horizon=5)
    env = ActionRepeat(inner, times=3)
    env.reset()
    _, r, term, _, _ = env.step(2)
    assert r == 3.0 and inner.executed == [2, 2, 2] and not term
    _, r, term, _, _ = env.step(1)
    assert r == 2.0 and term and inner.executed == [2, 2, 2, 1, 1]


def test_sticky_actions_repeat_the_previous_action_at_the_given_rate():
    inner = Recorder()
    env = StickyActions(inner, prob=0.3)

    def play():
        inner.executed.clear()
        env.reset(seed=3)
        env.step(0)
        for _ in range(1000):  # always choose an action other than the last executed: a repeat is a stick
            env.step((inner.executed[-1] + 1) % 4)
        return list(inner.executed)

    first = play()
    rate = np.mean([a == b for a, b in itertools.pairwise(first)])
    assert rate == pytest.approx(0.3, abs=0.05)
    assert play() == first  # same seed, same sticks


def test_distractor_features_widen_the_observation():
    env = DistractorFeatures(Recorder(), count=4)
    obs, _ = env.reset(seed=0)
    nxt = env.step(0)[0]
    assert obs.shape == (7,) and env.observation_space.shape == (7,) and env.observation_space.contains(obs)
    assert np.all(obs[:3] == 0) and not np.array_equal(obs[3:], nxt[3:])
    with pytest.raises(ConfigError, match="distractor_features needs a flat"):
        DistractorFeatures(Recorder(dict_obs=True), count=1)


def test_held_out_seeds_refuse_seeds_outside_the_range():
    env = HeldOutSeeds(Recorder(), start=100, count=2)
    env.reset()
    env.reset()
    with pytest.raises(ConfigError, match=r"held-out seed range \[100, 102\) is used up"):
        env.reset()
    with pytest.raises(ConfigError, match=r"seed 5 is outside the held-out range \[100, 102\)"):
        env.reset(seed=5)
    env.reset(seed=101)


def test_wrappers_reject_bad_parameters():
    with pytest.raises(ConfigError, match="observation_noise needs Box"):
        ObservationNoise(gym.make("FrozenLake-v1"), std=0.1)
    with pytest.raises(ConfigError, match="keys: 'y' is not a Box entry"):
        ObservationNoise(Recorder(dict_obs=True), std=0.1, keys=["y"])
