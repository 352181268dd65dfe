"""EnvRunner semantics (SAME_STEP autoreset, truncation bootstrap) and the local backend's worker processes."""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from polar.config.base import validate
from polar.config.run import RunConfig
from polar.errors import HarnessError
from polar.models.policy import build_policy
from polar.rollout.backends.base import make_backend
from polar.rollout.runner import EnvRunner
from tests.learning.envs import TimeoutValueEnv


def cfg_for(**dist):
    return validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "ppo"},
                                "distribution": dist})


def test_runner_marks_truncation_and_bootstraps_from_final_obs():
    env = gym.vector.SyncVectorEnv([lambda: TimeoutValueEnv(limit=5)] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "ppo"}})
    policy = build_policy(cfg, env.single_observation_space, env.single_action_space)
    frag = EnvRunner(env, policy, seed=0).collect(12)
    trunc = frag.truncated.astype(bool)
    assert trunc[4].all() and trunc[9].all() and trunc.sum() == 4
    assert not frag.terminated.any()
    # every observation is identical, so V(final_obs) equals the value the policy predicted at that step
    np.testing.assert_allclose(frag.trunc_values[trunc], frag.values[trunc], rtol=1e-5)
    assert (frag.trunc_values[~trunc] == 0).all()
    assert frag.episode_returns == [5.0] * 4 and frag.episode_lengths == [5] * 4
    assert frag.episode_starts[0].all() and frag.episode_starts[5].all() and not frag.episode_starts[1].any()


def test_local_workers_stream_version_tagged_fragments_and_pick_up_new_weights():
    cfg = cfg_for(rollout_workers=2, envs_per_worker=3)
    backend = make_backend(cfg, fragment_steps=16, seed=0)
    policy = build_policy(cfg, backend.observation_space, backend.action_space)
    backend.start(policy.state_dict(), version=0)
    try:
        frags = []
        deadline = time.monotonic() + 120  # worker start-up order depends on the scheduler
        while {f.worker_id for f in frags} != {0, 1} and time.monotonic() < deadline:
            frags.append(backend.next_fragment(timeout_s=120))
        assert {f.worker_id for f in frags} == {0, 1}
        assert all(f.policy_version == 0 and f.actions.shape == (16, 3) for f in frags)
        with torch.no_grad():  # a policy that always pushes right
            policy.agent.pi_head.weight.zero_()
            policy.agent.pi_head.bias.copy_(torch.tensor([-50.0, 50.0]))
        backend.publish_weights(policy.state_dict(), version=1)
        seen_new = []
        # Collection is first-ready: on a loaded machine one worker can deliver many fragments before
        # the other's next one, so bound the wait by time rather than by a fragment count.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            f = backend.next_fragment(timeout_s=120)
            if f.policy_version == 1:
                seen_new.append(f)
            if {g.worker_id for g in seen_new} == {0, 1}:
                break
        assert {g.worker_id for g in seen_new} == {0, 1}
        assert all((g.actions == 1).all() for g in seen_new)
    finally:
        backend.close()


def test_a_dead_worker_is_reported_not_waited_for():
    cfg = cfg_for(rollout_workers=1, envs_per_worker=2)
    backend = make_backend(cfg, fragment_steps=8, seed=0)
    policy = build_policy(cfg, backend.observation_space, backend.action_space)
    backend.start(policy.state_dict(), version=0)
    try:
        backend.next_fragment(timeout_s=120)
        os.kill(backend._procs[0].pid, signal.SIGKILL)
        backend._procs[0].join(timeout=30)
        with pytest.raises(HarnessError, match=r"rollout worker 0 .*died"):
            for _ in range(10):  # at most two fragments were already in flight
                backend.next_fragment(timeout_s=60)
    finally:
        backend.close()


def test_fused_path_fragment_values_are_the_critic_of_each_steps_observation():
    """On the numpy acting path each step runs only the actor; the fragment's values, taken in one batch at
    its end, must still be V(obs[t]) of every step and env, as ``act`` gives them."""
    cfg = cfg_for()
    env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    policy = build_policy(cfg, env.single_observation_space, env.single_action_space)
    runner = EnvRunner(env, policy, seed=0)
    assert runner.fast_act is not None and runner.fast_values is not None
    frag = runner.collect(40)
    _, _, info = policy.agent.act(torch.from_numpy(frag.obs.reshape(-1, 4)), None, True)
    np.testing.assert_allclose(frag.values, info["values"].detach().reshape(40, 3).numpy(), rtol=1e-5, atol=1e-6)
    assert frag.obs[0].tolist() != frag.obs[1].tolist()  # the observations move, so a misaligned value would show


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_the_fragment_actor_collects_what_acting_step_by_step_through_act_numpy_does(env_id):
    """The per-fragment numpy actor (noise drawn once, weights copied once per fragment) is a speed-up only: the
    fragments must equal, bit for bit, those of acting through ``act_numpy`` at every step, with the same seed,
    across episode ends, time-limit bootstraps, and weights that move between fragments."""
    frags: dict[bool, list] = {}
    for per_fragment in (True, False):
        torch.manual_seed(0)
        env = gym.vector.SyncVectorEnv([lambda: gym.make(env_id, max_episode_steps=9)] * 4,
                                       autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        policy = build_policy(cfg_for(), env.single_observation_space, env.single_action_space)
        runner = EnvRunner(env, policy, seed=0)
        assert runner.rollout_actor is not None and runner.fast_act is not None
        if not per_fragment:
            runner.rollout_actor = None
        frags[per_fragment] = []
        for _ in range(3):
            frags[per_fragment].append(runner.collect(20))
            with torch.no_grad():  # an update between fragments: the next fragment must act with the new weights
                for p in policy.agent.parameters():
                    p.add_(0.05 * torch.sin(torch.arange(p.numel(), dtype=torch.float32)).reshape(p.shape))
    for a, b in zip(frags[True], frags[False], strict=True):
        for name in ("obs", "actions", "log_probs", "values", "rewards", "terminated", "truncated", "episode_starts",
                     "trunc_values", "last_values"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        assert a.episode_returns == b.episode_returns and a.episode_lengths == b.episode_lengths
        assert a.truncated.any()  # the time limit of 9 steps ends episodes inside every fragment


def test_the_fragment_actor_samples_the_policys_categorical_distribution():
    """With fixed observations and logits log(0.25), log(0.75), the fragment actor's actions are 1 three times in
    four (within 5 sigma over 40,000 draws) and its log-probs are log(0.25) and log(0.75)."""
    env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 8, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    policy = build_policy(cfg_for(), env.single_observation_space, env.single_action_space)
    with torch.no_grad():
        policy.agent.pi_head.weight.zero_()
        policy.agent.pi_head.bias.copy_(torch.log(torch.tensor([0.25, 0.75])))
    actor = policy.agent.rollout_actor(5000, 8)
    obs = np.random.default_rng(0).uniform(-0.05, 0.05, (8, 4)).astype(np.float32)
    actions, log_probs = map(np.stack, zip(*(actor(obs, t) for t in range(5000)), strict=True))
    n = actions.size
    assert abs((actions == 1).sum() - 0.75 * n) < 5 * (n * 0.75 * 0.25) ** 0.5
    np.testing.assert_allclose(log_probs, np.where(actions == 1, np.log(0.75), np.log(0.25)), rtol=1e-6)


def test_on_policy_workers_collect_every_fragment_with_the_newest_weights():
    """PPO's backend mode: each worker waits for the weights of the last update before it collects again, so
    every batch holds one fragment per worker, all acted by the current version (no worker runs ahead)."""
    cfg = cfg_for(rollout_workers=2, envs_per_worker=2)
    backend = make_backend(cfg, fragment_steps=8, seed=0, on_policy=True)
    policy = build_policy(cfg, backend.observation_space, backend.action_space)
    backend.start(policy.state_dict(), version=0)
    try:
        for version in range(4):
            frags = [backend.next_fragment(timeout_s=120) for _ in range(2)]
            assert sorted(f.worker_id for f in frags) == [0, 1]
            assert [f.policy_version for f in frags] == [version, version]
            time.sleep(0.3)  # a worker that ran ahead would have a fragment of the old weights ready by now
            backend.publish_weights(policy.state_dict(), version=version + 1)
    finally:
        backend.close()


def test_ppo_with_rollout_workers_trains_with_no_policy_lag(tmp_path):
    """A PPO run with local rollout workers trains every update on fragments of the weights it just published
    (``policy_lag`` 0): fragments 1-2 updates old made PPO's defaults need more env steps (docs/benchmarks.md)."""
    from polar.trainers.build import compose
    from polar.trainers.run_dir import RunDir

    cfg = validate(RunConfig, {
        "harness": {"type": "gymnasium", "id": "CartPole-v1"},
        "policy": {"type": "ppo", "kwargs": {"n_steps": 16, "n_epochs": 1}},
        "distribution": {"backend": "local", "rollout_workers": 2, "envs_per_worker": 2},
        "total_env_steps": 6 * 16 * 4, "seed": 0,
        "logging": {"checkpoint_freq": 0, "tensorboard": False, "progress_bar": False},
        "eval": {"at_end": False},
    })
    rows: list[dict] = []
    compose(cfg, RunDir.create("ppo", tmp_path / "run"), on_iteration=lambda m: rows.append(dict(m))).train()
    assert len(rows) == 6
    assert [r["policy_lag"] for r in rows] == [0.0] * 6
