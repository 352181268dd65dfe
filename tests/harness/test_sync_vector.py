"""polar's in-process vector env against ``gymnasium.vector.SyncVectorEnv(autoreset_mode=SAME_STEP)``, step for step.

Same seeds, same actions: every observation, reward, flag and info (``final_obs``/``final_info``, the ``_key``
masks, nested dicts, key order, dtypes) must be equal, after each step and again at the end (a returned array
that a later step overwrote would differ then).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import minigrid  # noqa: F401  (registers the MiniGrid ids)
import numpy as np
import pytest

from polar.config.harness import GymnasiumHarnessConfig
from polar.harness import make_vector_env
from polar.harness.gymnasium_adapter import make_gymnasium_env
from polar.harness.sync_vector import SameStepVectorEnv
from tests.harness import masked_envs  # noqa: F401  (registers PolarInfoMaskedBandit-v0)


class SometimesInfoEnv(gym.Env):
    """Info keys on some steps only (scalars, strings, arrays, a nested dict), in its final info and in some
    resets' info; float64 observations for a float32 Box (stacking must cast as Gymnasium does); ends at random."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        info: dict[str, Any] = {"start": int(self.np_random.integers(100))} if self.np_random.random() < 0.5 else {}
        return self.np_random.normal(size=3), info

    def step(self, action):
        self.t += 1
        u = self.np_random.random()
        info: dict[str, Any] = {}
        if self.t % 3 == 0:
            info["count"] = self.t
        if u < 0.2:
            info["note"] = f"u={u:.3f}"
            info["sub"] = {"y": float(u), "arr": np.full(2, self.t, np.int32)}
        terminated = u > 0.93
        reward = np.float32(u) if self.t % 2 else int(action)
        return self.np_random.normal(size=3), reward, terminated, self.t >= 9, info


gym.register("PolarTestSometimesInfo-v0", entry_point=SometimesInfoEnv)


def same(a: Any, b: Any, where: str) -> None:
    """``a`` equals ``b`` down to types, dtypes, shapes and dict key order."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, tuple):
        assert type(b) is tuple and len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a!r} != {b!r}"
        if a.dtype == object:
            for i, (x, y) in enumerate(zip(a.reshape(-1), b.reshape(-1), strict=True)):
                same(x, y, f"{where}[{i}]")
        else:
            assert np.array_equal(a, b), f"{where}: {a!r} != {b!r}"
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


def legal_actions(obs: Any, envs: gym.vector.VectorEnv, rng: np.random.Generator) -> np.ndarray:
    """Random actions; where the observation carries an action mask, legal ones."""
    if isinstance(obs, dict) and "action_mask" in obs:
        return np.array([rng.choice(np.flatnonzero(m)) for m in obs["action_mask"]])
    return np.asarray(envs.action_space.sample())


CASES = {
    "cartpole, truncation at 12 steps": ({"id": "CartPole-v1", "kwargs": {"max_episode_steps": 12}}, 4, 120),
    "minigrid Dict with a Text mission": ({"id": "MiniGrid-Empty-5x5-v0", "kwargs": {"max_steps": 10}}, 3, 60),
    "info keys on some steps": ({"id": "PolarTestSometimesInfo-v0"}, 4, 150),
    "frozenlake Discrete obs, info every step": ({"id": "FrozenLake-v1"}, 3, 150),
    "blackjack Tuple obs": ({"id": "Blackjack-v1"}, 4, 80),
    "pendulum Box actions, truncation": ({"id": "Pendulum-v1", "kwargs": {"max_episode_steps": 15}}, 3, 60),
    "action mask from info, Dict obs": ({"id": "PolarInfoMaskedBandit-v0"}, 3, 80),
}


@pytest.mark.filterwarnings("ignore:.*(float32|not within the observation space).*:UserWarning")
@pytest.mark.parametrize("case", list(CASES))
def test_same_step_vector_env_equals_sync_vector_env_step_for_step(case):
    spec, num_envs, num_steps = CASES[case]
    cfg = GymnasiumHarnessConfig(**spec)
    ours = make_vector_env(cfg, num_envs, seed=3)
    ref = gym.vector.SyncVectorEnv([lambda: make_gymnasium_env(cfg) for _ in range(num_envs)],
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    ref.reset(seed=3)
    ref.action_space.seed(3)
    assert isinstance(ours, SameStepVectorEnv) and isinstance(ours, gym.vector.VectorEnv)
    assert ours.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    assert ours.single_observation_space == ref.single_observation_space
    assert ours.action_space == ref.action_space
    rng = np.random.default_rng(0)
    obs_ref, info_ref = ref.reset(seed=11)
    obs, info = ours.reset(seed=11)
    same(obs, obs_ref, "reset obs")
    same(info, info_ref, "reset info")
    ours_seen, ref_seen = [], []
    ends = truncations = keyed_steps = 0
    for t in range(num_steps):
        actions = legal_actions(obs_ref, ref, rng)
        out_ref = ref.step(actions.copy())
        out = ours.step(actions.copy())
        same(out, out_ref, f"{case}: step {t}")
        ours_seen.append(out)
        ref_seen.append(out_ref)
        obs_ref = out_ref[0]
        ends += int(np.count_nonzero(out_ref[2] | out_ref[3]))
        truncations += int(np.count_nonzero(out_ref[3]))
        keyed_steps += any(not k.startswith("_") and k not in ("final_obs", "final_info") for k in out_ref[4])
        if t == num_steps // 2:  # a partial reset reads the sub-envs' last observations
            mask = np.zeros(num_envs, np.bool_)
            mask[1] = True
            same(ours.reset(options={"reset_mask": mask}), ref.reset(options={"reset_mask": mask.copy()}),
                 f"{case}: partial reset at step {t}")
    for t, (a, b) in enumerate(zip(ours_seen, ref_seen, strict=True)):
        same(a, b, f"{case}: step {t} again at the end")
    assert ends >= num_envs, f"{case}: only {ends} episode ends; the case should exercise autoreset"
    if "truncation" in case:
        assert truncations > 0
    if "info" in case:
        assert keyed_steps > 0
    same(ours.reset(seed=5), ref.reset(seed=5), f"{case}: reseeded")
    ours.close()
    ref.close()


def test_the_gymnasium_harness_steps_in_polars_vector_env():
    envs = make_vector_env(GymnasiumHarnessConfig(id="CartPole-v1"), 2, seed=0)
    assert type(envs) is SameStepVectorEnv
    envs.close()


def test_a_wrong_number_of_actions_is_refused_as_by_sync_vector_env():
    envs = SameStepVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)])
    envs.reset(seed=0)
    with pytest.raises(ValueError):
        envs.step(np.zeros(2, np.int64))
    envs.close()
