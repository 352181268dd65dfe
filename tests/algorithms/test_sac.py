"""SAC's actor and update against references: the squashed-Gaussian log-probability (torch.distributions),
actions inside asymmetric Box bounds, the temperature's direction, the critic and actor losses recomputed by
hand, and Polyak-averaged target critics."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

from polar.algorithms.sac import SACLearner
from polar.buffers.replay_buffer import ReplayBuffer
from polar.config.base import validate
from polar.config.run import RunConfig
from polar.config.sac import SACKwargs
from polar.errors import ConfigError
from polar.models.off_policy import QCritic, SquashedGaussianAgent

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
ACTION_SPACE = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([3.0, 2.0], np.float32), dtype=np.float32)
LOW, HIGH = ACTION_SPACE.low, ACTION_SPACE.high
NETWORK = ([16, 16], "relu", [])


def make_agent(seed: int = 0) -> SquashedGaussianAgent:
    torch.manual_seed(seed)
    return SquashedGaussianAgent(OBS_SPACE, ACTION_SPACE, *NETWORK)


def make_learner(agent, **kw) -> SACLearner:
    base = {"batch_size": 32, "learning_rate": 1e-3, "learning_starts": 0, "gamma": 0.9}
    return SACLearner(agent, SACKwargs(**{**base, **kw}), lambda: QCritic(OBS_SPACE, ACTION_SPACE, *NETWORK), ACTION_SPACE,
                      total_env_steps=1000)


class RecordingReplay(ReplayBuffer):
    def sample(self, batch_size, beta=None):
        self.last = super().sample(batch_size, beta)
        return self.last


def filled_replay(n: int = 64, seed: int = 0) -> RecordingReplay:
    rng = np.random.default_rng(seed)
    replay = RecordingReplay(1000, OBS_SPACE, ACTION_SPACE, seed=seed)
    obs = rng.uniform(-1, 1, (n, 3)).astype(np.float32)
    actions = rng.uniform(LOW, HIGH, (n, 2)).astype(np.float32)
    rewards = rng.normal(size=n).astype(np.float32)
    next_obs = rng.uniform(-1, 1, (n, 3)).astype(np.float32)
    terminated = (rng.random(n) < 0.3).astype(np.float32)
    replay.add(obs, actions, rewards, next_obs, terminated)
    return replay


def reference(mu, log_std, u):
    """(env action, log-density of the squashed action in [-1, 1]^d) of u ~ N(mu, std), from torch.distributions.

    The log-probability is that of tanh(u), before the affine map to the Box bounds (SB3's convention), so
    ``target_entropy: auto`` = -dim(A) means the same whatever the bounds."""
    scale = torch.as_tensor((HIGH - LOW) / 2.0)
    bias = torch.as_tensor((HIGH + LOW) / 2.0)
    squashed = TransformedDistribution(Normal(mu, log_std.exp()), [TanhTransform(cache_size=1)])
    y = squashed.transforms[0](u)  # cached, so log_prob inverts it exactly instead of through atanh
    return AffineTransform(bias, scale)(y), squashed.log_prob(y).sum(-1)


@pytest.mark.parametrize("mu_shift", [0.0, 2.5])  # 2.5: most of the mass near the bounds, where tanh saturates
def test_sample_log_prob_matches_torch_distributions(mu_shift):
    agent = make_agent()
    with torch.no_grad():
        agent.mu.bias.add_(mu_shift)
    obs = torch.rand(256, 3) * 2 - 1
    torch.manual_seed(123)
    action, log_prob = agent.sample(obs)
    mu, log_std = agent._dist_params(obs)
    torch.manual_seed(123)
    u = mu + log_std.exp() * torch.randn_like(mu)  # the same noise sample() drew
    ref_action, ref_log_prob = reference(mu.detach(), log_std.detach(), u.detach())
    torch.testing.assert_close(action.detach(), ref_action, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(log_prob.detach(), ref_log_prob, rtol=0, atol=1e-4)
    assert log_prob.requires_grad  # reparameterized: the actor loss differentiates through it


def test_log_prob_does_not_depend_on_the_box_bounds():
    """Same weights, same noise, bounds [-1, 1]^2 vs the asymmetric box: same log-probability, scaled actions."""
    unit = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    torch.manual_seed(0)
    a = SquashedGaussianAgent(OBS_SPACE, unit, *NETWORK)
    b = make_agent()
    b.load_state_dict({k: v for k, v in a.state_dict().items() if not k.startswith("action_")}, strict=False)
    obs = torch.rand(64, 3) * 2 - 1
    torch.manual_seed(5)
    act_a, lp_a = a.sample(obs)
    torch.manual_seed(5)
    act_b, lp_b = b.sample(obs)
    torch.testing.assert_close(lp_a, lp_b)
    torch.testing.assert_close(act_b, act_a * torch.as_tensor((HIGH - LOW) / 2) + torch.as_tensor((HIGH + LOW) / 2))


def test_deterministic_act_is_tanh_of_mu_scaled_into_the_bounds():
    agent = make_agent()
    obs = torch.rand(64, 3) * 2 - 1
    agent.explore_uniform.fill_(0.0)
    action = agent.act(obs, deterministic=True)[0]
    mu, _ = agent._dist_params(obs)
    scale, bias = torch.as_tensor((HIGH - LOW) / 2), torch.as_tensor((HIGH + LOW) / 2)
    torch.testing.assert_close(action, torch.tanh(mu) * scale + bias)
    agent.explore_uniform.fill_(1.0)  # warm-up randomness never touches deterministic (eval) actions
    torch.testing.assert_close(agent.act(obs, deterministic=True)[0], action)


def inside(a: torch.Tensor) -> bool:
    a = a.detach().numpy()
    return bool(np.all(a >= LOW) and np.all(a <= HIGH))


@pytest.mark.parametrize("mu_bias, log_std_bias", [(0.0, 0.0), (50.0, 2.0), (-50.0, 2.0)])
def test_actions_stay_inside_asymmetric_bounds(mu_bias, log_std_bias):
    agent = make_agent()
    with torch.no_grad():
        agent.mu.bias.fill_(mu_bias)
        agent.log_std.bias.fill_(log_std_bias)
    obs = torch.rand(4096, 3) * 2 - 1
    agent.explore_uniform.fill_(0.0)
    for a in (agent.sample(obs)[0], agent.act(obs)[0], agent.act(obs, deterministic=True)[0]):
        assert a.shape == (4096, 2) and inside(a)
    agent.explore_uniform.fill_(1.0)
    uniform = agent.act(obs)[0]
    assert inside(uniform)
    # the warm-up covers the whole box, not [-1, 1]^2
    assert np.allclose(uniform.min(0).values.numpy(), LOW, atol=0.05)
    assert np.allclose(uniform.max(0).values.numpy(), HIGH, atol=0.05)


@pytest.mark.parametrize("target_entropy, direction", [(100.0, 1), (-100.0, -1)])
def test_auto_ent_coef_moves_towards_the_target_entropy(target_entropy, direction):
    """Entropy below the target raises the coefficient (explore more); above it lowers it."""
    learner = make_learner(make_agent(), ent_coef="auto", target_entropy=target_entropy)
    before = float(learner.log_ent_coef.detach())
    assert before == pytest.approx(0.0)  # 'auto' starts at 1.0
    learner.train(filled_replay(), gradient_steps=3, env_steps=100)
    after = float(learner.log_ent_coef.detach())
    assert (after - before) * direction > 0
    assert after == pytest.approx(before + direction * 3 * 1e-3, rel=0.05)  # Adam: about lr per step


def test_auto_ent_coef_default_target_is_minus_action_dim():
    learner = make_learner(make_agent())
    assert learner.target_entropy == -2.0


def test_auto_with_initial_value_starts_there():
    learner = make_learner(make_agent(), ent_coef="auto_0.1")
    assert float(learner.log_ent_coef.detach().exp()) == pytest.approx(0.1)
    stats = learner.train(filled_replay(), gradient_steps=1, env_steps=100)
    assert stats["ent_coef"] == pytest.approx(0.1)  # the value used in this step, before its own update
    assert float(learner.log_ent_coef.detach().exp()) != pytest.approx(0.1, rel=1e-6)


def test_fixed_ent_coef_is_used_as_is_in_the_critic_and_actor_losses():
    """Recompute both losses by hand from the same batch and the same noise."""
    ent_coef, gamma = 0.2, 0.9
    agent = make_agent()
    learner = make_learner(agent, ent_coef=ent_coef, gamma=gamma)
    assert learner.log_ent_coef is None and learner.ent_coef_optimizer is None
    with torch.no_grad():  # targets unlike the critics, so using the wrong one would show
        for p in learner.critic_target.parameters():
            p.add_(0.5 * torch.randn_like(p))
    agent0, critic_target0 = copy.deepcopy(agent), copy.deepcopy(learner.critic_target)
    critics0 = copy.deepcopy(learner.critics)
    replay = filled_replay()
    torch.manual_seed(7)
    stats = learner.train(replay, gradient_steps=1, env_steps=100)
    b = replay.last

    torch.manual_seed(7)
    with torch.no_grad():
        a_pi, log_pi = agent0.sample(b.obs)
        next_a, next_log_pi = agent0.sample(b.next_obs)
        next_q = torch.min(*(c(b.next_obs, next_a) for c in critic_target0)) - ent_coef * next_log_pi
        target_q = b.rewards + (1 - b.terminated) * gamma * next_q
        q1, q2 = (c(b.obs, b.actions) for c in critics0)  # the critic loss sees the critics before their step
        critic_loss = 0.5 * (torch.nn.functional.mse_loss(q1, target_q) + torch.nn.functional.mse_loss(q2, target_q))
        q_pi = torch.min(*(c(b.obs, a_pi) for c in learner.critics))  # the actor sees the just-updated critics
    assert stats["ent_coef"] == pytest.approx(ent_coef)
    assert stats["critic_loss"] == pytest.approx(float(critic_loss), rel=1e-4)
    assert stats["actor_loss"] == pytest.approx(float((ent_coef * log_pi - q_pi).mean()), rel=1e-4, abs=1e-5)
    assert stats["entropy"] == pytest.approx(float(-log_pi.mean()), rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("interval", [1, 2])
def test_target_critics_move_by_polyak_tau_every_target_update_interval_steps(interval):
    tau = 0.1
    learner = make_learner(make_agent(), tau=tau, target_update_interval=interval)
    replay = filled_replay()
    old_target = [p.clone() for p in learner.critic_target.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(old_target, learner.critics.parameters(), strict=True))
    learner.train(replay, gradient_steps=1, env_steps=1)
    new_target = [p.clone() for p in learner.critic_target.parameters()]
    critics = [p.detach() for p in learner.critics.parameters()]
    if interval == 1:
        for t_new, t_old, c in zip(new_target, old_target, critics, strict=True):
            torch.testing.assert_close(t_new, (1 - tau) * t_old + tau * c, rtol=1e-6, atol=1e-7)
        assert not all(torch.equal(t, c) for t, c in zip(new_target, critics, strict=True))
    else:
        assert all(torch.equal(a, b) for a, b in zip(new_target, old_target, strict=True))  # 1 step < 2
        learner.train(replay, gradient_steps=1, env_steps=2)
        critics = [p.detach() for p in learner.critics.parameters()]
        for t_new, t_old, c in zip(learner.critic_target.parameters(), old_target, critics, strict=True):
            torch.testing.assert_close(t_new, (1 - tau) * t_old + tau * c, rtol=1e-6, atol=1e-7)


def test_warm_up_is_uniform_until_learning_starts():
    agent = make_agent()
    learner = make_learner(agent, learning_starts=50)
    learner.set_exploration(49)
    assert float(agent.explore_uniform) == 1.0
    learner.set_exploration(50)
    assert float(agent.explore_uniform) == 0.0


@pytest.mark.parametrize("value", ["autox", -1, 0, "auto_", "0.1"])
def test_bad_ent_coef_is_rejected_at_config_load(value):
    with pytest.raises(ConfigError, match=r"ent_coef"):
        validate(RunConfig, {"harness": {"type": "gymnasium", "id": "Pendulum-v1"},
                             "policy": {"type": "sac", "kwargs": {"ent_coef": value}}})


@pytest.mark.parametrize("value", ["auto_0", "auto_0.0"])
def test_auto_ent_coef_with_a_zero_initial_value_is_rejected_at_config_load(value):
    """log(0) has no learnable temperature: the config must say so, not the learner's math.log later."""
    with pytest.raises(ConfigError, match=r"ent_coef"):
        validate(RunConfig, {"harness": {"type": "gymnasium", "id": "Pendulum-v1"},
                             "policy": {"type": "sac", "kwargs": {"ent_coef": value}}})


@pytest.mark.parametrize("low, high", [(-np.inf, np.inf),
                                       (np.array([-1.0, -np.inf], np.float32), np.array([1.0, 1.0], np.float32))])
def test_infinite_action_bounds_are_a_config_error(low, high):
    space = gym.spaces.Box(low, high, shape=(2,), dtype=np.float32)
    with pytest.raises(ConfigError, match=r"finite"):
        SquashedGaussianAgent(OBS_SPACE, space, *NETWORK)
