"""PPO's pure pieces against hand-computed references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from polar.algorithms.advantages import compute_gae, rollout_gae
from polar.algorithms.optim import Adam
from polar.algorithms.ppo import ppo_loss, ppo_policy_loss, ppo_value_loss, schedule_value
from polar.buffers.rollout_buffer import RolloutBuffer
from polar.types import Fragment


def reference_gae(rewards, values, dones, last_value, gamma, lam):
    """Textbook GAE for one env, written as a plain loop over python floats."""
    T = len(rewards)
    adv = [0.0] * T
    gae = 0.0
    for t in reversed(range(T)):
        next_v = last_value if t == T - 1 else values[t + 1]
        nonterminal = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_v * nonterminal - values[t]
        gae = delta + gamma * lam * nonterminal * gae
        adv[t] = gae
    return adv


def test_gae_matches_reference_across_episode_boundaries():
    rng = np.random.default_rng(0)
    T, N = 7, 3
    r = rng.normal(size=(T, N)).astype(np.float32)
    v = rng.normal(size=(T, N)).astype(np.float32)
    d = (rng.random((T, N)) < 0.3).astype(np.float32)
    last = rng.normal(size=N).astype(np.float32)
    adv, ret = compute_gae(torch.from_numpy(r), torch.from_numpy(v), torch.from_numpy(d), torch.from_numpy(last), 0.97, 0.9)
    for n in range(N):
        ref = reference_gae(r[:, n], v[:, n], d[:, n], last[n], 0.97, 0.9)
        np.testing.assert_allclose(adv[:, n].numpy(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ret.numpy(), adv.numpy() + v, rtol=1e-6)


def _fragment(rewards, values, terminated, truncated, trunc_values, last_values):
    T, N = rewards.shape
    z = np.zeros((T, N), np.float32)
    return Fragment(obs=np.zeros((T, N, 1), np.float32), actions=np.zeros((T, N), np.int64), log_probs=z, values=values,
                    rewards=rewards, terminated=terminated, truncated=truncated, episode_starts=z, trunc_values=trunc_values,
                    last_values=last_values)


def test_truncation_bootstraps_from_final_obs_value_and_termination_does_not():
    one = np.ones((1, 2), np.float32)
    zero = np.zeros((1, 2), np.float32)
    values = np.full((1, 2), 3.0, np.float32)
    # env 0 truncated (V(final_obs)=5), env 1 terminated; last_values belong to the *next* episode
    frag = _fragment(rewards=one, values=values, terminated=np.array([[0, 1]], np.float32),
                     truncated=np.array([[1, 0]], np.float32), trunc_values=np.array([[5.0, 0.0]], np.float32),
                     last_values=np.array([100.0, 100.0], np.float32))
    _, returns = rollout_gae(RolloutBuffer([frag]), gamma=0.9, gae_lambda=1.0)
    assert returns[0, 0].item() == pytest.approx(1.0 + 0.9 * 5.0)  # bootstrapped from the final obs
    assert returns[0, 1].item() == pytest.approx(1.0)  # terminal: no bootstrap
    del zero


def test_minibatches_before_advantages_is_a_clear_error():
    frag = _fragment(*(np.zeros((2, 1), np.float32) for _ in range(5)), last_values=np.zeros(1, np.float32))
    with pytest.raises(RuntimeError, match="advantages/returns are not set"):
        next(RolloutBuffer([frag]).minibatches(1))


def test_clipped_surrogate_stops_gradient_beyond_the_clip():
    adv = torch.tensor([1.0, -1.0])
    old = torch.zeros(2)
    # ratio 1.5 with positive advantage and 0.5 with negative advantage are both outside [0.8, 1.2]
    logp = torch.log(torch.tensor([1.5, 0.5])).requires_grad_(True)
    loss, clip_frac, _ = ppo_policy_loss(logp, old, adv, 0.2)
    loss.backward()
    assert torch.allclose(logp.grad, torch.zeros(2))
    assert clip_frac.item() == 1.0
    assert loss.item() == pytest.approx(-(1.2 * 1.0 + 0.8 * -1.0) / 2)
    logp2 = torch.zeros(2, requires_grad=True)  # ratio 1: unclipped, gradient = -adv / n
    ppo_policy_loss(logp2, old, adv, 0.2)[0].backward()
    assert torch.allclose(logp2.grad, -adv / 2)


def test_value_clipping_limits_the_update_around_old_values():
    old = torch.tensor([0.0])
    ret = torch.tensor([10.0])
    new = torch.tensor([5.0])
    assert ppo_value_loss(new, old, ret, None).item() == pytest.approx(25.0)
    assert ppo_value_loss(new, old, ret, 1.0).item() == pytest.approx(81.0)


def test_entropy_bonus_and_coefficients_compose():
    lp = torch.zeros(4)
    ent = torch.full((4,), 0.5)
    v = torch.zeros(4)
    loss, st = ppo_loss(lp, ent, v, lp, v, torch.zeros(4), torch.ones(4), 0.2, None, ent_coef=0.1, vf_coef=0.5,
                        normalize_advantage=False)
    assert loss.item() == pytest.approx(0.5 * 1.0 - 0.1 * 0.5)
    assert st["entropy"].item() == pytest.approx(0.5)


def test_schedules():
    assert schedule_value(1e-3, "constant", 0.7) == 1e-3
    assert schedule_value(1e-3, "linear", 0.25) == pytest.approx(7.5e-4)
    assert schedule_value(1e-3, "linear", 1.5) == 0.0


def test_flat_adam_and_clip_match_torch():
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    b = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    b.load_state_dict(a.state_dict())
    oa = torch.optim.Adam(a.parameters(), lr=3e-3, eps=1e-5)
    ob = Adam(b.parameters(), lr=3e-3, eps=1e-5)
    for _ in range(15):
        x = torch.randn(8, 3)
        for net, opt in ((a, oa), (b, ob)):
            opt.zero_grad()
            (net(x) ** 2).sum().backward()
        torch.nn.utils.clip_grad_norm_(a.parameters(), 0.3)
        ob.clip_grad_norm_(0.3)
        oa.step()
        ob.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb)


@pytest.mark.parametrize("discrete", [True, False])
@pytest.mark.parametrize("clip_range_vf", [None, 0.05])
@pytest.mark.parametrize("ent_coef", [0.0, 0.02])
def test_fused_gradients_equal_autograd(discrete, clip_range_vf, ent_coef):
    from gymnasium import spaces

    from polar.algorithms.ppo_fused import fused_ppo_grads, supports_fused
    from polar.config.agent import BuiltinAgentConfig
    from polar.models import build_agent

    torch.manual_seed(0)
    act_space = spaces.Discrete(3) if discrete else spaces.Box(-1, 1, (2,), np.float32)
    agent = build_agent(BuiltinAgentConfig(), spaces.Box(-1, 1, (5,), np.float32), act_space)
    assert supports_fused(agent)
    opt = Adam(agent.parameters())
    obs = torch.randn(64, 5)
    with torch.no_grad():
        actions, _, info = agent.act(obs)
    old_logp = info["log_prob"] + 0.3 * torch.randn(64)  # ratios on both sides of the clip range
    old_v = info["values"] + 0.1 * torch.randn(64)
    adv, ret = torch.randn(64), torch.randn(64)
    opt.zero_grad()
    logp, ent, v = agent.evaluate_actions(obs, actions)
    loss, ref_stats = ppo_loss(logp, ent, v, old_logp, old_v, adv, ret, 0.2, clip_range_vf, ent_coef, 0.5, False)
    loss.backward()
    expected = opt.flat_grad.clone()
    opt.zero_grad()
    stats = fused_ppo_grads(agent, obs, actions, old_logp, old_v, adv, ret, 0.2, clip_range_vf, ent_coef, 0.5, True)
    torch.testing.assert_close(opt.flat_grad, expected, atol=1e-6, rtol=1e-5)
    assert expected.abs().max() > 1e-3
    for k in ("pg_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
        torch.testing.assert_close(stats[k], ref_stats[k])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_fused_paths_numpy_kernels_equal_torchs(dtype):
    """The fused update's tanh and weight-gradient product go through numpy for float32 CPU tensors (torch's
    CPU kernels are several times slower at these sizes) and through torch otherwise; both give torch's values."""
    from polar.algorithms.ppo_fused import _tanh_, _weight_grad

    torch.manual_seed(0)
    for rows, cols, k in [(256, 64, 4), (256, 64, 64), (7, 3, 5)]:
        h = torch.randn(rows, cols, dtype=dtype) * 3
        ref = torch.tanh(h)
        got = _tanh_(h)
        assert got.data_ptr() == h.data_ptr()  # in place
        torch.testing.assert_close(got, ref, atol=2e-7 if dtype == torch.float32 else 0, rtol=0)
        g, x = torch.randn(rows, cols, dtype=dtype), torch.randn(rows, k, dtype=dtype)
        out = torch.empty(cols, k, dtype=dtype)
        _weight_grad(g, x, out)
        torch.testing.assert_close(out, g.t() @ x)
        _weight_grad(g, x.t().contiguous().t(), out)  # a column-major input
        torch.testing.assert_close(out, g.t() @ x)
