"""``harness: {type: envpool}``: EnvPool's C++ vector envs under polar's SAME_STEP contract.

The central test replays one EnvPool CartPole through polar's runner and, for the same reset states and
actions, Gymnasium's own CartPole through ``SyncVectorEnv``; the recorded transitions (flags, final
observations, the truncation bootstrap, episode returns) must be the same.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import envpool
import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from polar.config import load_config
from polar.config.base import validate
from polar.config.run import RunConfig
from polar.errors import ConfigError
from polar.harness import make_env, make_vector_env
from polar.models.policy import build_policy
from polar.rollout.runner import EnvRunner
from polar.trainers.preflight import check_before_start

ROOT = Path(__file__).resolve().parents[2]
N, T, LIMIT, SEED = 4, 120, 15, 3


@pytest.fixture(autouse=True)
def _leave_the_torch_rng_as_it_was():
    """These tests build and train policies; later test files that draw weights from the global RNG see it
    as if this file had not run (tests/rollout/test_rollout.py's truncation test compares numpy and torch
    values at rtol 1e-5 without atol, which some weight draws miss)."""
    with torch.random.fork_rng():
        yield


def run_cfg(harness: dict, **top):
    return validate(RunConfig, {"harness": harness, "policy": {"type": "ppo"}, **top})


class ReplayedCartPole(CartPoleEnv):
    """Gymnasium's CartPole whose resets return, in order, the reset states EnvPool drew for one env."""

    def __init__(self, starts: list[np.ndarray]):
        super().__init__()
        self.starts = list(starts)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = self.starts.pop(0).astype(np.float64)
        self.steps_beyond_terminated = None
        return np.array(self.state, dtype=np.float32), {}


def _scripted(runner: EnvRunner, actions: np.ndarray):
    """Act with a fixed action sequence (the runner's fused acting hook); values are the real critic's."""
    t = [0]

    def act(obs):
        a = actions[t[0]]
        t[0] += 1
        _, _, _, info = runner._act(obs, None, deterministic=True)
        return a, np.zeros(len(a), np.float32), runner._values(info, len(a))
    return act


def _collect(vec_env, actions):
    with torch.random.fork_rng():  # the same weights on both sides, and later tests see the RNG as it was
        torch.manual_seed(0)
        cfg = run_cfg({"type": "gymnasium", "id": "CartPole-v1"})
        policy = build_policy(cfg, vec_env.single_observation_space, vec_env.single_action_space)
        runner = EnvRunner(vec_env, policy, seed=SEED, keep_next_obs=True)
        runner.fast_act = _scripted(runner, actions)
        return runner.collect(T)


def test_envpool_transitions_match_gymnasium_vector_env():
    actions = np.random.default_rng(0).integers(0, 2, (T, N))
    through_envpool = _collect(make_vector_env(run_cfg({"type": "envpool", "id": "CartPole-v1",
                                                        "kwargs": {"max_episode_steps": LIMIT}}).harness, N, seed=SEED),
                               actions)
    # EnvPool's own reset states for these seeds: every full reset draws each env's next one
    pool = envpool.make_gymnasium("CartPole-v1", num_envs=N, seed=SEED, max_episode_steps=LIMIT)
    starts = [pool.reset()[0] for _ in range(T)]
    gym_envs = gym.vector.SyncVectorEnv(
        [lambda i=i: gym.wrappers.TimeLimit(ReplayedCartPole([s[i] for s in starts]), LIMIT) for i in range(N)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    through_gymnasium = _collect(gym_envs, actions)

    a, b = through_envpool, through_gymnasium
    assert a.terminated.any() and a.truncated.any()  # both ways an episode ends are exercised, and
    assert (a.terminated.astype(bool) & a.truncated.astype(bool)).any()  # a fall on the last allowed step
    for name in ("terminated", "truncated", "episode_starts", "rewards"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.episode_returns == b.episode_returns and a.episode_lengths == b.episode_lengths
    np.testing.assert_allclose(a.obs, b.obs, atol=1e-5)  # every step's observation, first ones of episodes too
    np.testing.assert_allclose(a.next_obs, b.next_obs, atol=1e-5)  # final observations where episodes ended
    np.testing.assert_allclose(a.trunc_values, b.trunc_values, atol=1e-5)  # V(final obs) of truncated episodes
    boot = a.truncated.astype(bool) & ~a.terminated.astype(bool)  # a fall on the last step is not bootstrapped
    assert (a.trunc_values[boot] != 0).all() and (a.trunc_values[~boot] == 0).all()


def test_num_envs_seed_and_kwargs_take_effect(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("seed: 5\nharness: {type: envpool, id: CartPole-v1, kwargs: {max_episode_steps: 7}}\n"
                 "policy: {type: ppo}\ndistribution: {rollout_workers: 0, envs_per_worker: 3}\n")
    cfg = load_config(p)
    n = cfg.distribution.envs_per_runner
    envs = make_vector_env(cfg.harness, n, seed=cfg.seed)
    obs, _ = envs.reset(seed=cfg.seed)
    assert n == 3 and obs.shape == (3, 4) and envs.observation_space.shape == (3, 4)
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    for k in range(7):
        _, _, term, trunc, info = envs.step(np.zeros(3, np.int64) + k % 2)  # alternate: the pole stays up
    assert trunc.all() and not term.any() and info["_final_obs"].all()  # max_episode_steps: 7
    again, _ = envs.reset(seed=5)
    np.testing.assert_array_equal(again, obs)  # the same seed gives the same episodes
    other, _ = envs.reset(seed=6)
    assert not np.allclose(other, obs)
    envs.close()


def test_single_env_for_evaluation():
    env = make_env(run_cfg({"type": "envpool", "id": "CartPole-v1", "kwargs": {"max_episode_steps": 4}}).harness)
    obs, _ = env.reset(seed=1)
    assert obs.shape == (4,) and env.observation_space.contains(obs)
    for _ in range(4):
        obs, reward, term, trunc, _ = env.step(env.action_space.sample() * 0 + 1 - int(obs[2] > 0))
    assert reward == 1.0 and trunc and not term
    first, _ = env.reset(seed=1)
    again, _ = env.reset(seed=1)
    np.testing.assert_array_equal(first, again)
    env.close()


@pytest.mark.parametrize(("env_id", "shape", "dtype"), [("Pong-v5", (4, 84, 84), np.uint8),
                                                        ("Hopper-v4", (11,), np.float64)])
def test_atari_and_mujoco_ids(env_id, shape, dtype):
    envs = make_vector_env(run_cfg({"type": "envpool", "id": env_id}).harness, 2, seed=0)
    obs, _ = envs.reset()
    assert obs.shape == (2, *shape) and obs.dtype == dtype
    obs, reward, _, _, _ = envs.step(envs.action_space.sample())
    assert obs.shape == (2, *shape) and reward.shape == (2,)
    envs.close()


def test_dict_observations_keep_the_same_step_contract():
    envs = make_vector_env(run_cfg({"type": "envpool", "id": "MiniGrid-Empty-5x5-v0",
                                    "kwargs": {"max_episode_steps": 3}}).harness, 2, seed=0)
    first, _ = envs.reset()
    assert isinstance(envs.single_observation_space, gym.spaces.Dict) and first["image"].shape == (2, 7, 7, 3)
    for _ in range(3):
        obs, _, term, trunc, info = envs.step(np.array([2, 2]))  # forward: the agent moves off its start
    assert trunc.all() and not term.any()
    np.testing.assert_array_equal(obs["direction"], first["direction"])  # already the next episode's start
    np.testing.assert_array_equal(obs["image"], first["image"])
    assert set(info["final_obs"][0]) == set(first) and not np.array_equal(info["final_obs"][0]["image"], first["image"][0])
    envs.close()


def test_atari_id_trains_with_the_cnn_agent(tmp_path):
    """EnvPool's Atari preprocessing (4 stacked 84x84 grey frames, uint8) feeds polar's CNN agent as it is."""
    from polar.trainers.build import compose
    from polar.trainers.run_dir import RunDir

    cfg = run_cfg({"type": "envpool", "id": "Pong-v5", "kwargs": {"episodic_life": True, "reward_clip": True}},
                  name="pong", agent={"type": "cnn"}, total_env_steps=64,
                  distribution={"rollout_workers": 0, "envs_per_worker": 2},
                  logging={"tensorboard": False, "checkpoint_freq": 0}, eval={"at_end": False},
                  policy={"type": "ppo", "kwargs": {"n_steps": 16, "batch_size": 32, "n_epochs": 1}})
    cfg._config_dir = tmp_path
    assert compose(cfg, RunDir.create(cfg.name, tmp_path / "run")).train()["env_steps"] == 64


@pytest.mark.parametrize(("harness", "message"), [
    ({"type": "envpool", "id": "CartPol-v1"},
     "harness.id: unknown EnvPool id 'CartPol-v1' (did you mean: CartPole-v1, CartPole-v0"),
    ({"type": "envpool", "id": "CartPole-v1", "kwargs": {"num_envs": 4}},
     "harness.kwargs.num_envs: polar sets it; use distribution.num_envs"),
    ({"type": "envpool", "id": "CartPole-v1", "kwargs": {"frame_skip": 4}},
     "harness.kwargs.frame_skip: EnvPool's CartPole-v1 has no such option; its options are num_threads"),
])
def test_bad_input_is_one_line_before_start(harness, message):
    with pytest.raises(ConfigError) as e:
        check_before_start(run_cfg(harness))
    assert message in str(e.value) and "\n" not in str(e.value)
    if "unknown" in message:
        assert "envpool.list_all_envs()" in str(e.value)


def test_envpool_run_trains(tmp_path):
    """The example's path in process, a few iterations (the slow test below runs it through polar run to 475)."""
    from polar.trainers.build import compose
    from polar.trainers.run_dir import RunDir

    cfg = load_config(ROOT / "examples" / "cartpole_ppo_envpool.yaml",
                      ["total_env_steps=1024", "eval.episodes=2", "logging.tensorboard=false"])
    res = compose(cfg, RunDir.create(cfg.name, tmp_path / "run")).train()
    assert res["env_steps"] == 1024 and res["eval"]["episodes"] == 2, res


@pytest.mark.slow
def test_polar_run_solves_cartpole_on_envpool(tmp_path):
    out = subprocess.run([sys.executable, "-m", "polar.cli.main", "run", "--no-progress", "--config",
                          str(ROOT / "examples" / "cartpole_ppo_envpool.yaml"), "--run-dir", str(tmp_path / "run"),
                          "-o", "logging.tensorboard=false"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    log = out.stderr + out.stdout
    assert "stop_reward 475 reached" in log, log[-2000:]
    steps = int(re.search(r"finished: ([\d,]+) env steps", log).group(1).replace(",", ""))
    assert steps <= 150_000
    assert float(re.search(r"│\s+20 │\s+([\d.]+) │", log).group(1)) >= 475  # the deterministic policy, fresh envs
