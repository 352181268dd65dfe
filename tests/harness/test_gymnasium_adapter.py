"""The Gymnasium adapter: any registered id from YAML, SAME_STEP autoreset, Dict observations."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from polar.config import load_config
from polar.errors import ConfigError
from polar.harness import make_env, make_vector_env


class DictObsEnv(gym.Env):
    """An image plus a vector; the episode lasts 4 steps."""

    observation_space = gym.spaces.Dict(
        {"image": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), "vector": gym.spaces.Box(-1, 1, (3,), np.float32)}
    )
    action_space = gym.spaces.MultiDiscrete([3, 2])

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        assert self.action_space.contains(action)
        self.t += 1
        return self._obs(), float(action.sum()), self.t >= 4, False, {}

    def _obs(self):
        img = self.np_random.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        return {"image": img, "vector": np.full(3, self.t / 4, np.float32)}


gym.register("PolarTestDictObs-v0", entry_point=DictObsEnv)


def cfg(tmp_path, harness):
    p = tmp_path / "run.yaml"
    p.write_text(f"harness: {harness}\npolicy: {{type: ppo}}\n")
    return load_config(p).harness


def test_cartpole_vector_env_same_step_autoreset(tmp_path):
    envs = make_vector_env(cfg(tmp_path, "{type: gymnasium, id: CartPole-v1}"), 4, seed=0)
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    envs.reset(seed=0)
    for _ in range(200):
        obs, _reward, term, _trunc, info = envs.step(np.ones(4, dtype=np.int64))  # always right: falls fast
        if term.any():
            break
    i = int(np.flatnonzero(term)[0])
    assert info["_final_obs"][i] and abs(info["final_obs"][i][2]) > 0.2  # pole angle past the limit
    assert abs(obs[i][2]) < 0.05  # already the next episode's first observation
    envs.close()


def test_pendulum_continuous_actions_and_truncation(tmp_path):
    envs = make_vector_env(cfg(tmp_path, "{type: gymnasium, id: Pendulum-v1, kwargs: {max_episode_steps: 10}}"), 2, seed=1)
    envs.reset()
    for _k in range(10):
        obs, reward, term, trunc, info = envs.step(np.full((2, 1), 0.3, np.float32))
    assert trunc.all() and not term.any() and info["_final_obs"].all()  # a time limit is a truncation
    assert obs.shape == (2, 3) and reward.dtype == np.float64
    envs.close()


def test_dict_observation_env(tmp_path):
    h = cfg(tmp_path, "{type: gymnasium, id: PolarTestDictObs-v0}")
    envs = make_vector_env(h, 3, seed=2)
    obs, _ = envs.reset()
    assert obs["image"].shape == (3, 8, 8, 3) and obs["image"].dtype == np.uint8
    for _ in range(4):
        obs, reward, term, _trunc, info = envs.step(np.array([[2, 1]] * 3))
    assert term.all() and reward.tolist() == [3.0] * 3
    assert info["final_obs"][0]["vector"].tolist() == [1.0] * 3 and obs["vector"][0].tolist() == [0.0] * 3
    envs.close()
    env = make_env(h)
    assert env.observation_space == DictObsEnv.observation_space
    env.close()


def test_seeded_vector_envs_are_reproducible(tmp_path):
    h = cfg(tmp_path, "{type: gymnasium, id: CartPole-v1}")
    a, b = make_vector_env(h, 2, seed=7), make_vector_env(h, 2, seed=7)
    np.testing.assert_array_equal(a.reset()[0], b.reset()[0])


def test_unknown_id_did_you_mean(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown Gymnasium id 'CartPol-v1' \(did you mean: CartPole-v1"):
        make_vector_env(cfg(tmp_path, "{type: gymnasium, id: CartPol-v1}"), 2)


def test_module_prefixed_id_imports_the_registering_module(tmp_path):
    env = make_env(cfg(tmp_path, f"{{type: gymnasium, id: '{__name__}:PolarTestDictObs-v0'}}"))
    assert isinstance(env.observation_space, gym.spaces.Dict)
    env.close()
    with pytest.raises(ConfigError, match="cannot import 'no_such_pkg'"):
        make_env(cfg(tmp_path, "{type: gymnasium, id: 'no_such_pkg:Thing-v0'}"))


def test_harness_wrappers_wrap_the_env_in_order_and_name_code():
    """MiniGrid's Dict observation (with a text mission) becomes its 7x7x3 view, then a flat vector the MLP reads."""
    from polar.config.harness import GymnasiumHarnessConfig
    from polar.config.trust import code_references

    cfg = GymnasiumHarnessConfig(id="minigrid:MiniGrid-DoorKey-5x5-v0",
                                 wrappers=["minigrid.wrappers:ImgObsWrapper", "gymnasium.wrappers:FlattenObservation"])
    envs = make_vector_env(cfg, 2, seed=0)
    try:
        assert envs.single_observation_space == gym.spaces.Box(0, 255, (147,), np.uint8)
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 147)
    finally:
        envs.close()
    assert ("wrappers", "minigrid.wrappers:ImgObsWrapper gymnasium.wrappers:FlattenObservation") in code_references(cfg)


@pytest.mark.parametrize(("name", "message"), [
    ("minigrid.wrappers.ImgObsWrapper", r"harness.wrappers\[0\] 'minigrid.wrappers.ImgObsWrapper': write 'module:Class'"),
    ("nosuchpkg:W", r"harness.wrappers\[0\] 'nosuchpkg:W': cannot import 'nosuchpkg'"),
    ("minigrid.wrappers:NoSuch", r"'minigrid.wrappers' has no 'NoSuch'; fix the name"),
    ("gymnasium:make", r"'gymnasium:make' is not a gymnasium.Wrapper subclass"),
])
def test_a_bad_wrapper_name_is_one_line_naming_the_entry(name, message):
    from polar.config.harness import GymnasiumHarnessConfig
    from polar.trainers.preflight import check_before_start

    with pytest.raises(ConfigError, match=message):
        make_env(GymnasiumHarnessConfig(id="minigrid:MiniGrid-DoorKey-5x5-v0", wrappers=[name]))
    cfg = load_config_dict({"name": "w", "harness": {"type": "gymnasium", "id": "CartPole-v1", "wrappers": [name]},
                            "policy": {"type": "ppo"}})
    with pytest.raises(ConfigError, match=message):
        check_before_start(cfg)  # polar run refuses before it creates anything


def load_config_dict(data: dict):
    from polar.config.base import validate
    from polar.config.run import RunConfig

    return validate(RunConfig, data)
