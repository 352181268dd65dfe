"""RND (policy.kwargs.intrinsic): the normalizers' maths, the bonus falling on revisited states, the checkpoint
round trip, the fused PPO path training on the same advantages, and the off-policy refusal."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from polar.algorithms.rnd import RND
from polar.config.base import validate
from polar.config.intrinsic import RNDConfig
from polar.config.run import RunConfig
from polar.errors import ConfigError
from tests.learning.conftest import train_in_process

SPACE = gym.spaces.Box(-10.0, 10.0, shape=(4,), dtype=np.float32)


def _rnd(**kw) -> RND:
    torch.manual_seed(0)
    return RND(SPACE, RNDConfig(hidden_sizes=[32], embedding_dim=16, **kw))


def test_the_observation_normalizer_holds_the_batch_moments_and_the_return_std_follows_a_non_episodic_filter():
    rnd = _rnd(gamma=0.9)
    T, N = 6, 3
    obs = torch.randn(T, N, 4) * torch.tensor([1.0, 2.0, 3.0, 4.0]) + 5.0
    nxt = torch.randn(T, N, 4) * torch.tensor([1.0, 2.0, 3.0, 4.0]) + 5.0
    rnd.advantages(obs, nxt, T, N)
    flat = nxt.reshape(-1, 4).double()  # the observations the bonus scores
    assert torch.allclose(rnd.obs_norm.mean, flat.mean(0), atol=1e-6)
    assert torch.allclose(rnd.obs_norm.var, flat.var(0, unbiased=False), rtol=1e-3)
    # the forward filter: discounted sums of the bonuses of next_obs, per env column, never reset
    raw = rnd.novelty(nxt.reshape(-1, 4)).reshape(T, N).double()
    running, rets = torch.zeros(N, dtype=torch.float64), []
    for t in range(T):
        running = 0.9 * running + raw[t]
        rets.append(running)
    assert torch.allclose(rnd.return_filter, running, rtol=1e-4)
    expected_var = torch.stack(rets).var(unbiased=False)
    assert float(rnd.return_norm.var) == pytest.approx(float(expected_var), rel=1e-3)
    assert rnd.metrics["intrinsic/reward_mean"] == pytest.approx(float(raw.mean() / expected_var.sqrt()), rel=1e-3)


def test_the_bonus_falls_on_revisited_states_and_stays_high_on_new_ones():
    rnd = _rnd(update_proportion=1.0, n_epochs=20, batch_size=64, learning_rate=1e-3)
    torch.manual_seed(1)
    seen = torch.randn(16, 8, 4)
    unseen = torch.randn(128, 4) * 3.0 + 6.0
    rnd.advantages(seen, seen, 16, 8)
    before = rnd.novelty(seen.reshape(-1, 4)).mean()
    for _ in range(5):
        rnd.advantages(seen, seen, 16, 8)
        rnd.train_on_batch()
    after = rnd.novelty(seen.reshape(-1, 4)).mean()
    assert after < 0.3 * before
    assert rnd.novelty(unseen).mean() > 3 * after


def _ppo_cfg(algo: str = "ppo", **kw) -> dict:
    kwargs = {"n_steps": 16, "n_epochs": 2, **({"num_minibatches": 2} if algo == "ppo" else {}),
              "intrinsic": {"type": "rnd", "hidden_sizes": [16], "embedding_dim": 8}, **kw}
    return {"name": "rnd", "harness": {"type": "gymnasium", "id": "CartPole-v1"}, "seed": 3,
            "policy": {"type": algo, "kwargs": kwargs},
            "distribution": {"backend": "local", "rollout_workers": 0, "envs_per_worker": 2},
            "total_env_steps": 64, "eval": {"at_end": False}, "logging": {"checkpoint_freq": 1, "tensorboard": False}}


@pytest.mark.parametrize("algo", ["ppo", "appo"])
def test_its_networks_and_normalizers_are_checkpointed_restored_on_resume_and_its_metrics_logged(tmp_path, algo):
    import json

    from polar.trainers.build import compose
    from polar.trainers.checkpoint import CheckpointManager

    _, trainer = train_in_process(tmp_path, _ppo_cfg(algo))
    rnd = trainer.learner.algorithm.intrinsic
    state = CheckpointManager(trainer.run_dir.checkpoints_dir).load_latest()
    saved = state["learner"]["intrinsic"]["modules"]
    assert {"predictor.0.weight", "target.0.weight", "critic.0.weight", "obs_norm.mean", "return_norm.var",
            "return_filter"} <= set(saved)
    assert float(saved["obs_norm.count"]) >= 64  # every observation of the run's 64 env steps
    again = compose(trainer.cfg.model_copy(update={"total_env_steps": 96}), trainer.run_dir, resume=True)
    again.restore()
    restored = again.learner.algorithm.intrinsic
    for key, value in rnd.state_dict().items():
        assert torch.equal(restored.state_dict()[key], value), key
    assert restored.optimizer.state_dict()["step"] == rnd.optimizer.state_dict()["step"] > 0
    row = json.loads((trainer.run_dir.path / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["intrinsic/reward_mean"] > 0 and row["intrinsic/predictor_loss"] > 0
    assert {"intrinsic/value_loss", "intrinsic/return_std"} <= set(row)


def test_the_fused_path_trains_on_the_same_combined_advantages_as_autograd():
    """``fused: auto`` keeps the hand-derived gradient with RND on (the bonus enters the advantages before the
    epochs, which both paths read): one update from the same rollout and the same RND gives the same weights."""
    from polar.algorithms.ppo import PPOLearner
    from polar.buffers.rollout_buffer import RolloutBuffer
    from polar.models.policy import build_policy
    from polar.rollout.backends.base import make_backend
    from polar.types import Batch, Rollout

    cfg = validate(RunConfig, _ppo_cfg())
    torch.manual_seed(0)
    backend = make_backend(cfg, 16, seed=0)
    policy = build_policy(cfg, backend.observation_space, backend.action_space)
    try:
        backend.start(policy.state_dict(), 0, policy=policy)
        frag = backend.next_fragment()
    finally:
        backend.close()
    initial = {k: v.clone() for k, v in policy.state_dict().items()}
    after = {}
    for fused in ("auto", "off"):
        policy.load_state_dict(initial)
        torch.manual_seed(1)  # the same RND networks and the same minibatch order
        intrinsic = RND(backend.observation_space, cfg.policy.kwargs.intrinsic)
        learner = PPOLearner(policy.agent, cfg.policy.kwargs.model_copy(update={"fused": fused}), 1000, intrinsic)
        assert learner.fused == (fused == "auto")
        stats = learner.update(Batch(Rollout([frag], buffer=RolloutBuffer([frag])), env_steps=frag.env_steps))
        assert stats["intrinsic/reward_mean"] > 0
        after[fused] = {k: v.clone() for k, v in policy.state_dict().items()}
    moved = [k for k in initial if not torch.equal(initial[k], after["off"][k])]
    assert moved
    for key in moved:
        assert torch.allclose(after["auto"][key], after["off"][key], atol=1e-5), key


@pytest.mark.parametrize("algo", ["dqn", "sac", "bc"])
def test_an_intrinsic_reward_on_another_algorithm_is_one_line_naming_the_key(algo):
    data = _ppo_cfg()
    data["policy"] = {"type": algo, "kwargs": {"intrinsic": {"type": "rnd"}}}
    with pytest.raises(ConfigError) as e:
        validate(RunConfig, data)
    msg = str(e.value)
    assert "'policy.kwargs.intrinsic': an intrinsic reward (RND) trains with on-policy PPO or APPO" in msg
    assert f"policy '{algo}'" in msg and "\n" not in msg


def test_every_documented_intrinsic_key_takes_effect():
    """Each key of docs/exploration.md's ``intrinsic`` table changes what the module computes as documented."""
    from polar.algorithms.rnd import combine

    T, N = 8, 4
    torch.manual_seed(2)
    obs = torch.randn(T, N, 4)
    # coef / ext_coef: the policy's advantage is ext_coef * A_ext + coef * A_int
    ext, intr = torch.randn(T, N), torch.randn(T, N)
    assert torch.allclose(combine(ext, intr, RNDConfig(coef=0.5, ext_coef=3.0)), 3.0 * ext + 0.5 * intr)
    # gamma / gae_lambda: lambda 0 gives the one-step TD error r_t + gamma * V(s_t+1) - V(s_t), no episode cut
    rnd = _rnd(gamma=0.5, gae_lambda=0.0)
    nxt = torch.randn(T, N, 4)
    adv = rnd.advantages(obs, nxt, T, N)
    flat = obs.reshape(-1, 4)
    with torch.no_grad():
        v = rnd.critic(rnd._inputs(flat)).reshape(T, N)
        v_last = rnd.critic(rnd._inputs(nxt[-1])).reshape(N)
    r = rnd.novelty(nxt.reshape(-1, 4)).reshape(T, N) / rnd.metrics["intrinsic/return_std"]
    assert torch.allclose(adv[:-1], r[:-1] + 0.5 * v[1:] - v[:-1], atol=1e-5)
    assert torch.allclose(adv[-1], r[-1] + 0.5 * v_last - v[-1], atol=1e-5)
    # hidden_sizes / embedding_dim: the target, predictor and critic widths
    rnd = RND(SPACE, RNDConfig(hidden_sizes=[8, 12], embedding_dim=5))
    assert [m.out_features for m in rnd.target if isinstance(m, torch.nn.Linear)] == [8, 12, 5]
    assert [m.out_features for m in rnd.critic if isinstance(m, torch.nn.Linear)] == [8, 12, 1]
    # obs_clip: normalized observations are clipped to +-obs_clip
    rnd = _rnd(obs_clip=1.5)
    rnd.advantages(obs, obs, T, N)
    assert float(rnd._inputs(torch.full((1, 4), 1e3)).max()) == pytest.approx(1.5)
    # learning_rate, n_epochs, batch_size: Adam's step, and n_epochs * ceil(valid samples / batch_size) steps
    rnd = _rnd(learning_rate=3e-3, n_epochs=3, batch_size=10)
    rnd.advantages(obs, obs, T, N)
    rnd.train_on_batch()
    assert rnd.optimizer.lr == 3e-3
    assert rnd.optimizer.state_dict()["step"] == 3 * -(-(T * N) // 10)
    # update_proportion: the predictor's loss covers that share of each minibatch; with a tiny share it barely moves
    moved = {}
    for share in (1.0, 1e-3):
        rnd = _rnd(update_proportion=share, n_epochs=5, learning_rate=1e-3)
        rnd.advantages(obs, obs, T, N)
        before = rnd.novelty(flat).mean()
        rnd.train_on_batch()
        moved[share] = float(before - rnd.novelty(flat).mean())
    assert moved[1.0] > 0.1 * float(before) and abs(moved[1e-3]) < 0.1 * moved[1.0], moved


def _cartpole_fragment(steps: int = 64, **intrinsic):
    """One real fragment of a PPO + RND CartPole run (2 envs; episodes of a fresh policy end every ~20 steps)."""
    from polar.models.policy import build_policy
    from polar.rollout.backends.base import make_backend

    data = _ppo_cfg(n_steps=steps)
    data["policy"]["kwargs"]["intrinsic"].update(intrinsic)
    cfg = validate(RunConfig, data)
    torch.manual_seed(0)
    backend = make_backend(cfg, steps, seed=0)
    policy = build_policy(cfg, backend.observation_space, backend.action_space)
    try:
        backend.start(policy.state_dict(), 0, policy=policy)
        return cfg, backend.observation_space, backend.next_fragment()
    finally:
        backend.close()


def test_a_run_with_rnd_keeps_the_observation_each_step_reached_the_final_one_where_an_episode_ended():
    from polar.rollout.runner import runner_options

    _, _, frag = _cartpole_fragment()
    assert frag.next_obs is not None and frag.next_obs.shape == frag.obs.shape
    done = np.logical_or(frag.terminated, frag.truncated)
    assert done[:-1].any()
    for t in range(frag.num_steps - 1):
        for i in range(frag.num_envs):
            if done[t, i]:  # CartPole's final state is out of bounds; obs[t + 1] is the next episode's reset one
                x, theta = frag.next_obs[t, i, 0], frag.next_obs[t, i, 2]
                assert abs(x) > 2.4 or abs(theta) > 0.2095
                assert not np.array_equal(frag.next_obs[t, i], frag.obs[t + 1, i])
            else:
                assert np.array_equal(frag.next_obs[t, i], frag.obs[t + 1, i])
    plain = validate(RunConfig, {**_ppo_cfg(), "policy": {"type": "ppo", "kwargs": {"n_steps": 16}}})
    assert runner_options(plain)["keep_next_obs"] is False  # plain PPO does not pay for the copy


def test_each_step_is_paid_the_novelty_of_what_it_reached_and_the_intrinsic_return_runs_on_across_episode_ends():
    """lambda 0: A_int[t] = r_t + gamma * V(obs[t + 1]) - V(obs[t]) at every step, an episode's last one included
    (no episode end cuts the intrinsic return), r_t the novelty of ``next_obs[t]`` (the final observation there,
    not the reset one), and the fragment's last step bootstraps from ``V(next_obs[-1])``: no step goes unpaid."""
    _, space, frag = _cartpole_fragment(gamma=0.5, gae_lambda=0.0)
    T, N = frag.num_steps, frag.num_envs
    torch.manual_seed(1)
    rnd = RND(space, RNDConfig(gamma=0.5, gae_lambda=0.0, hidden_sizes=[16], embedding_dim=8))
    adv = rnd.advantages(torch.as_tensor(frag.obs), torch.as_tensor(frag.next_obs), T, N)
    obs, nxt = torch.as_tensor(frag.obs).reshape(T * N, -1), torch.as_tensor(frag.next_obs).reshape(T * N, -1)
    std = rnd.metrics["intrinsic/return_std"]
    r = (rnd.novelty(nxt) / std).reshape(T, N)
    with torch.no_grad():
        v = rnd.critic(rnd._inputs(obs)).reshape(T, N)
        v_last = rnd.critic(rnd._inputs(nxt.reshape(T, N, -1)[-1])).reshape(N)
    done = torch.as_tensor(np.logical_or(frag.terminated, frag.truncated))
    ends = [(t, i) for t in range(T - 1) for i in range(N) if done[t, i]]
    assert ends
    for t, i in ends:
        assert float(adv[t, i]) == pytest.approx(float(r[t, i] + 0.5 * v[t + 1, i] - v[t, i]), abs=1e-5)
        assert abs(float(0.5 * v[t + 1, i])) > 1e-4  # the continuation an episodic return would have cut
        reset_bonus = float(rnd.novelty(torch.as_tensor(frag.obs[t + 1, i])[None])) / std
        assert float(r[t, i]) != pytest.approx(reset_bonus, rel=1e-3)
    assert torch.allclose(adv[-1], r[-1] + 0.5 * v_last - v[-1], atol=1e-5)
    assert bool((adv[-1] != 0).all())
    # and every step, the last included, trains the predictor and the critic: n_epochs * ceil(T * N / batch_size)
    rnd.train_on_batch()
    assert rnd.optimizer.state_dict()["step"] == rnd.cfg.n_epochs * -(-(T * N) // rnd.cfg.batch_size)


@pytest.mark.parametrize("algo", ["ppo", "appo"])
def test_rnd_with_the_policys_observation_normalisation_is_one_line_naming_the_keys(algo):
    data = _ppo_cfg(algo, normalize_obs=True)
    with pytest.raises(ConfigError) as e:
        validate(RunConfig, data)
    msg = str(e.value)
    assert "normalize_obs: true with intrinsic" in msg and "set normalize_obs: false" in msg and "\n" not in msg
