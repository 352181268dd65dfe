"""V-trace against a direct transcription of the IMPALA paper's sum formula (eq. 1)."""

import math

import numpy as np
import pytest
import torch

from polar.algorithms.appo import appo_loss, bootstrap_truncated_rewards, episode_discounts, vtrace


def reference_vtrace(mu_logp, pi_logp, rewards, values, bootstrap, discounts, rho_bar, c_bar):
    """vs_s = V(x_s) + sum_{t>=s} (prod_{i<t} gamma_i) (prod_{s<=i<t} c_i) delta_t, written as plain loops."""
    T, B = rewards.shape
    vs = np.zeros((T, B))
    adv = np.zeros((T, B))
    for b in range(B):
        v_next = [values[t + 1, b] if t + 1 < T else bootstrap[b] for t in range(T)]
        ratio = [math.exp(pi_logp[t, b] - mu_logp[t, b]) for t in range(T)]
        rho = [min(rho_bar, r) for r in ratio]
        c = [min(c_bar, r) for r in ratio]
        delta = [rho[t] * (rewards[t, b] + discounts[t, b] * v_next[t] - values[t, b]) for t in range(T)]
        for s in range(T):
            total = values[s, b]
            for t in range(s, T):
                weight = 1.0
                for i in range(s, t):
                    weight *= discounts[i, b] * c[i]
                total += weight * delta[t]
            vs[s, b] = total
        for s in range(T):
            vs_next = vs[s + 1, b] if s + 1 < T else bootstrap[b]
            adv[s, b] = rho[s] * (rewards[s, b] + discounts[s, b] * vs_next - values[s, b])
    return vs, adv


def random_batch(T=7, B=3, seed=0, spread=0.8):
    rng = np.random.default_rng(seed)
    mu = np.log(rng.uniform(0.05, 1.0, size=(T, B)))
    pi = mu + rng.normal(0, spread, size=(T, B))
    rewards = rng.normal(size=(T, B))
    values = rng.normal(size=(T, B))
    bootstrap = rng.normal(size=B)
    done = rng.uniform(size=(T, B)) < 0.2
    discounts = 0.9 * (~done)
    return mu, pi, rewards, values, bootstrap, discounts


@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (2.0, 0.5), (100.0, 100.0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vtrace_matches_reference(rho_bar, c_bar, seed):
    mu, pi, r, v, boot, disc = random_batch(seed=seed)
    want_vs, want_adv = reference_vtrace(mu, pi, r, v, boot, disc, rho_bar, c_bar)
    t = lambda x: torch.as_tensor(x, dtype=torch.float64)  # noqa: E731
    out = vtrace(t(mu), t(pi), t(r), t(v), t(boot), t(disc), clip_rho=rho_bar, clip_c=c_bar)
    np.testing.assert_allclose(out.vs.numpy(), want_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.pg_advantages.numpy(), want_adv, rtol=1e-10, atol=1e-10)


def test_on_policy_vtrace_is_the_n_step_return():
    """With pi == mu and clips >= 1, vs is the bootstrapped discounted return (lambda = 1)."""
    mu, _, r, v, boot, disc = random_batch(T=6, B=2, seed=5)
    t = lambda x: torch.as_tensor(x, dtype=torch.float64)  # noqa: E731
    out = vtrace(t(mu), t(mu), t(r), t(v), t(boot), t(disc))
    T, B = r.shape
    for b in range(B):
        ret = boot[b]
        for s in range(T - 1, -1, -1):
            ret = r[s, b] + disc[s, b] * ret
            assert out.vs[s, b].item() == pytest.approx(ret, abs=1e-10)


def test_traces_stop_at_episode_ends():
    """A terminal step's target is its own reward: nothing from the next episode leaks in."""
    T, B = 4, 1
    r = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    v = torch.zeros(T, B)
    logp = torch.zeros(T, B)
    term = torch.tensor([[0], [1], [0], [0]])
    disc = episode_discounts(term, torch.zeros_like(term), gamma=0.5)
    out = vtrace(logp, logp, r, v, torch.tensor([100.0]), disc)
    assert out.vs[1, 0].item() == pytest.approx(2.0)
    assert out.vs[0, 0].item() == pytest.approx(1.0 + 0.5 * 2.0)
    assert out.vs[2, 0].item() == pytest.approx(3.0 + 0.5 * (4.0 + 0.5 * 100.0))


def test_truncation_bootstraps_from_final_value():
    r = torch.tensor([[1.0], [1.0]])
    trunc = torch.tensor([[0], [1]])
    disc = episode_discounts(torch.zeros_like(trunc), trunc, gamma=0.9)
    r2 = bootstrap_truncated_rewards(r, trunc, torch.tensor([[0.0], [10.0]]), gamma=0.9)
    logp = torch.zeros(2, 1)
    out = vtrace(logp, logp, r2, torch.zeros(2, 1), torch.tensor([-50.0]), disc)
    assert out.vs[1, 0].item() == pytest.approx(1.0 + 0.9 * 10.0)  # not the next episode's -50


def test_stale_actions_that_the_target_dislikes_are_downweighted():
    """rho < 1 shrinks the advantage of an action the current policy would rarely take."""
    r = torch.ones(1, 2)
    v = torch.zeros(1, 2)
    mu = torch.log(torch.tensor([[0.5, 0.5]]))
    pi = torch.log(torch.tensor([[0.5, 0.05]]))
    out = vtrace(mu, pi, r, v, torch.zeros(2), torch.zeros(1, 2))
    assert out.pg_advantages[0, 1] < out.pg_advantages[0, 0]
    assert out.pg_advantages[0, 1].item() == pytest.approx(0.1)


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="shapes differ"):
        vtrace(torch.zeros(3, 2), torch.zeros(3, 1), torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(2), torch.zeros(3, 2))


def test_appo_loss_gradient_raises_logp_of_positive_advantage_actions():
    new_logp = torch.log(torch.tensor([0.3, 0.3])).requires_grad_(True)
    out = appo_loss(
        new_logp=new_logp,
        behaviour_logp=torch.log(torch.tensor([0.3, 0.3])),
        advantages=torch.tensor([1.0, -1.0]),
        new_values=torch.zeros(2, requires_grad=True),
        vs=torch.ones(2),
        entropy=torch.ones(2),
        clip_range=0.2,
        vf_coef=0.5,
        ent_coef=0.0,
    )
    out.loss.backward()
    assert new_logp.grad[0] < 0 < new_logp.grad[1]  # descent raises logp of the good action
    assert out.value_loss.item() == pytest.approx(1.0)  # MSE, PPO's convention (vf_coef outside, no 1/2)
