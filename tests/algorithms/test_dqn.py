"""DQN's update on hand-built batches: the Huber target, Double DQN, the epsilon schedule, target-network
updates and prioritized-replay priorities, each against a value computed by hand."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from polar.algorithms.dqn import DQNLearner
from polar.buffers.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer
from polar.config.dqn import DQNKwargs
from polar.models.off_policy import QNetworkAgent
from polar.types import Fragment

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
ACTION_SPACE = gym.spaces.Discrete(3)
GAMMA = 0.9
ONLINE_Q = [0.0, 0.0, 5.0]  # online net: Q(s, .) for every s; its argmax is action 2
TARGET_Q = [1.0, 3.0, 2.0]  # target net: max is 3 (action 1), while Q_target(s', 2) = 2

# (action, reward, terminated, truncated) of the four stored transitions
TRANSITIONS = [
    (0, 0.5, 0.0, 0.0),   # ordinary step: bootstraps
    (2, -1.0, 1.0, 0.0),  # true terminal: no bootstrap
    (1, 0.2, 0.0, 1.0),   # truncated by a time limit, not terminal: bootstraps
    (2, 2.0, 0.0, 0.0),   # |TD error| < 1: the quadratic part of the Huber loss
]


def make_kwargs(**over) -> DQNKwargs:
    base = {"gamma": GAMMA, "batch_size": 64, "learning_rate": 1e-3, "learning_starts": 0,
            "target_update_interval": 1, "tau": 1.0}
    return DQNKwargs(**{**base, **over})


def make_agent(seed: int = 0) -> QNetworkAgent:
    torch.manual_seed(seed)
    return QNetworkAgent(OBS_SPACE, ACTION_SPACE, [8], "relu", [])


def set_constant_q(net: torch.nn.Sequential, values) -> None:
    """Make ``net`` output ``values`` for every observation (last layer: zero weights, bias = values)."""
    with torch.no_grad():
        net[-1].weight.zero_()
        net[-1].bias.copy_(torch.tensor(values))


class RecordingReplay(ReplayBuffer):
    """Keeps the last sampled batch, so a test can recompute the loss on exactly what the learner saw."""

    def sample(self, batch_size, beta=None):
        self.last = super().sample(batch_size, beta)
        return self.last


class RecordingPrioritizedReplay(PrioritizedReplayBuffer):
    def sample(self, batch_size, beta=None):
        self.last = super().sample(batch_size, beta)
        return self.last


def fragment_of(transitions) -> Fragment:
    """A one-env fragment holding ``transitions`` (T = len), with distinct observations."""
    T = len(transitions)
    obs = np.linspace(-0.9, 0.9, 2 * T, dtype=np.float32).reshape(T, 1, 2)
    next_obs = -obs
    col = np.array([[a] for a, _, _, _ in transitions], np.int64)
    rew, term, trunc = (np.array([[t[i]] for t in transitions], np.float32) for i in (1, 2, 3))
    zeros = np.zeros((T, 1), np.float32)
    return Fragment(obs=obs, actions=col, log_probs=zeros, values=zeros, rewards=rew, terminated=term,
                    truncated=trunc, episode_starts=zeros, trunc_values=zeros, last_values=np.zeros(1, np.float32),
                    next_obs=next_obs)


def filled(replay_cls=RecordingReplay, **kw):
    replay = replay_cls(100, OBS_SPACE, ACTION_SPACE, seed=0, **kw)
    replay.add_fragment(fragment_of(TRANSITIONS))
    return replay


def huber(x: np.ndarray) -> np.ndarray:
    ax = np.abs(x)
    return np.where(ax < 1.0, 0.5 * x**2, ax - 0.5)


def expected_td(batch, next_value: float) -> np.ndarray:
    """target - Q(s, a) for the constant-Q nets above."""
    actions = batch.actions.numpy()
    q = np.array(ONLINE_Q)[actions]
    target = batch.rewards.numpy() + GAMMA * (1.0 - batch.terminated.numpy()) * next_value
    return target - q


@pytest.mark.parametrize("double_q, next_value", [(False, max(TARGET_Q)), (True, TARGET_Q[int(np.argmax(ONLINE_Q))])])
def test_huber_loss_uses_the_bootstrapped_target(double_q, next_value):
    """Plain DQN scores s' with max_a' Q_target; Double DQN with Q_target(s', argmax_a' Q_online(s', a'))."""
    agent = make_agent()
    learner = DQNLearner(agent, make_kwargs(double_q=double_q), total_env_steps=1000)
    set_constant_q(agent.q_net, ONLINE_Q)
    set_constant_q(learner.target, TARGET_Q)
    replay = filled()
    stats = learner.train(replay, gradient_steps=1, env_steps=500)
    batch = replay.last
    assert set(batch.indices.tolist()) == {0, 1, 2, 3}  # 64 draws over 4 slots: every kind of transition is in
    td = expected_td(batch, next_value)
    assert stats["loss"] == pytest.approx(float(huber(td).mean()), rel=1e-5)
    # the truncated transition (slot 2) bootstrapped; the terminated one (slot 1) did not
    by_slot = dict(zip(batch.indices.tolist(), td.tolist(), strict=True))
    assert by_slot[2] == pytest.approx(0.2 + GAMMA * next_value)
    assert by_slot[1] == pytest.approx(-1.0 - 5.0)
    assert stats["q_mean"] == pytest.approx(float(np.array(ONLINE_Q)[batch.actions.numpy()].mean()), rel=1e-5)


def test_double_q_and_plain_targets_differ_when_the_nets_disagree():
    """Guards the test above: with these nets the two targets are really different numbers."""
    losses = {}
    for double_q in (False, True):
        agent = make_agent()
        learner = DQNLearner(agent, make_kwargs(double_q=double_q), total_env_steps=1000)
        set_constant_q(agent.q_net, ONLINE_Q)
        set_constant_q(learner.target, TARGET_Q)
        losses[double_q] = learner.train(filled(), gradient_steps=1, env_steps=500)["loss"]
    assert losses[False] != pytest.approx(losses[True], rel=1e-3)


def sb3_linear(start: float, end: float, end_fraction: float, progress_remaining: float) -> float:
    """stable_baselines3.common.utils.get_linear_fn, as SB3's DQN calls it with 1 - steps / total."""
    if (1 - progress_remaining) > end_fraction:
        return end
    return start + (1 - progress_remaining) * (end - start) / end_fraction


@pytest.mark.parametrize("steps", [0, 1, 250, 500, 999, 1000, 1001, 5000, 10_000, 20_000])
def test_exploration_rate_matches_sb3_linear_schedule(steps):
    total = 10_000
    kw = make_kwargs(exploration_fraction=0.1, exploration_initial_eps=1.0, exploration_final_eps=0.05)
    learner = DQNLearner(make_agent(), kw, total_env_steps=total)
    expected = sb3_linear(1.0, 0.05, 0.1, 1 - min(1.0, steps / total))
    assert learner.exploration_rate(steps) == pytest.approx(expected, abs=1e-12)


def test_set_exploration_acts_uniformly_until_learning_starts_then_epsilon_greedy():
    kw = make_kwargs(learning_starts=300, exploration_fraction=0.5, exploration_initial_eps=1.0,
                     exploration_final_eps=0.0)
    agent = make_agent()
    learner = DQNLearner(agent, kw, total_env_steps=1000)
    set_constant_q(agent.q_net, ONLINE_Q)
    obs = torch.zeros(2000, 2)

    learner.set_exploration(299)
    assert float(agent.explore_uniform) == 1.0
    assert float(agent.epsilon) == pytest.approx(1.0 - 299 / 500)
    counts = np.bincount(agent.act(obs)[0].numpy(), minlength=3)
    assert counts.min() > 500  # uniform over the 3 actions, whatever epsilon says

    learner.set_exploration(300)
    assert float(agent.explore_uniform) == 0.0
    assert float(agent.epsilon) == pytest.approx(0.4)
    actions = agent.act(obs)[0].numpy()
    # epsilon-greedy: greedy action 2 with prob 1 - eps + eps/3
    assert abs((actions == 2).mean() - (0.6 + 0.4 / 3)) < 0.05

    learner.set_exploration(500)  # end of the decay: eps = final = 0, fully greedy
    assert float(agent.epsilon) == 0.0
    assert (agent.act(obs)[0].numpy() == 2).all()
    assert (agent.act(obs, deterministic=True)[0].numpy() == 2).all()


def params(net: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_hard_target_update_waits_for_target_update_interval_env_steps():
    agent = make_agent()
    learner = DQNLearner(agent, make_kwargs(tau=1.0, target_update_interval=100), total_env_steps=10_000)
    replay = filled()
    initial = params(learner.target)

    learner.train(replay, gradient_steps=1, env_steps=50)
    assert not all(torch.equal(a, b) for a, b in zip(params(agent.q_net), initial, strict=True))  # online moved
    assert_same(params(learner.target), initial)  # 50 < 100 env steps: target untouched

    learner.train(replay, gradient_steps=1, env_steps=100)
    assert_same(params(learner.target), params(agent.q_net))  # hard copy
    copied = params(learner.target)

    learner.train(replay, gradient_steps=1, env_steps=150)
    assert_same(params(learner.target), copied)  # 50 since the last copy
    learner.train(replay, gradient_steps=1, env_steps=199)
    assert_same(params(learner.target), copied)
    learner.train(replay, gradient_steps=1, env_steps=200)
    assert_same(params(learner.target), params(agent.q_net))
    assert learner.last_target_update == 200


def perturbed_target_learner(tau: float, interval: int) -> DQNLearner:
    learner = DQNLearner(make_agent(), make_kwargs(tau=tau, target_update_interval=interval), total_env_steps=10_000)
    with torch.no_grad():  # a target that differs from the online net
        for p in learner.target.parameters():
            p.add_(torch.randn_like(p))
    return learner


def assert_polyak(learner: DQNLearner, before: list[torch.Tensor], coef: float) -> None:
    for t_new, t_old, o in zip(params(learner.target), before, params(learner.agent.q_net), strict=True):
        torch.testing.assert_close(t_new, (1 - coef) * t_old + coef * o, rtol=1e-6, atol=1e-6)


def test_soft_target_update_is_polyak_averaging():
    tau = 0.3
    learner = perturbed_target_learner(tau, interval=1)
    before = params(learner.target)
    learner.train(filled(), gradient_steps=2, env_steps=1)  # one update due
    assert_polyak(learner, before, tau)
    assert not all(torch.equal(t, o) for t, o in zip(params(learner.target), params(learner.agent.q_net), strict=True))


def test_soft_target_updates_due_since_the_last_phase_compound():
    """SB3 updates every target_update_interval env steps; a phase that spans k of them applies k at once:
    1 - (1 - tau)^k, and the remainder counts towards the next."""
    tau = 0.3
    learner = perturbed_target_learner(tau, interval=10)
    replay = filled()
    before = params(learner.target)
    learner.train(replay, gradient_steps=1, env_steps=35)  # 3 updates due (10, 20, 30)
    assert_polyak(learner, before, 1 - (1 - tau) ** 3)
    assert learner.last_target_update == 30
    before = params(learner.target)
    learner.train(replay, gradient_steps=1, env_steps=39)
    assert_same(params(learner.target), before)
    learner.train(replay, gradient_steps=1, env_steps=40)  # the 5 steps left over from 35 count
    assert_polyak(learner, before, tau)


def test_prioritized_replay_priorities_follow_abs_td_error_and_weights_enter_the_loss():
    eps = 1e-3
    agent = make_agent()
    kw = make_kwargs(prioritized_replay=True, prioritized_replay_eps=eps, prioritized_replay_beta0=0.5,
                     batch_size=8)
    learner = DQNLearner(agent, kw, total_env_steps=1000)
    set_constant_q(agent.q_net, ONLINE_Q)
    set_constant_q(learner.target, TARGET_Q)
    replay = filled(RecordingPrioritizedReplay, alpha=0.6, eps=eps)
    # unequal priorities, so the importance weights are not all 1
    replay.update_priorities(np.arange(4), np.array([0.1, 4.0, 1.0, 0.5]))
    stats = learner.train(replay, gradient_steps=1, env_steps=500)
    batch = replay.last
    w = batch.weights.numpy()
    assert w.min() < 1.0
    td = expected_td(batch, max(TARGET_Q))
    assert stats["loss"] == pytest.approx(float((w * huber(td)).mean()), rel=1e-5)
    for slot, err in zip(batch.indices.tolist(), td.tolist(), strict=True):
        assert replay.priorities[slot] == pytest.approx(abs(err) + eps, rel=1e-5)
    untouched = sorted(set(range(4)) - set(batch.indices.tolist()))
    before = {0: 0.1 + eps, 1: 4.0 + eps, 2: 1.0 + eps, 3: 0.5 + eps}
    for slot in untouched:
        assert replay.priorities[slot] == pytest.approx(before[slot])
    assert replay.total_priority == pytest.approx(float((replay.priorities[:4] ** 0.6).sum()))


def test_numpy_rollout_path_acts_like_the_torch_agent():
    """EnvRunner steps flat-vector envs through act_numpy: greedy actions and values must equal act()'s,
    epsilon 0 must be greedy, epsilon 1 uniform, and weights changed by the optimizer must be seen."""
    agent = make_agent(3)
    assert agent.supports_act_numpy()
    obs = np.random.default_rng(0).uniform(-1, 1, size=(4000, 2)).astype(np.float32)
    greedy, _, info = agent.act(torch.from_numpy(obs), deterministic=True)
    a_np, logp_np, v_np = agent.act_numpy(obs, deterministic=True)
    np.testing.assert_array_equal(a_np, greedy.numpy())
    np.testing.assert_allclose(v_np, info["values"].detach().numpy(), rtol=1e-5, atol=1e-6)
    assert logp_np.shape == (4000,)

    agent.explore_uniform.fill_(0.0)
    agent.epsilon.fill_(0.0)
    np.testing.assert_array_equal(agent.act_numpy(obs)[0], greedy.numpy())
    agent.epsilon.fill_(1.0)
    counts = np.bincount(agent.act_numpy(obs)[0], minlength=3)
    assert np.all(np.abs(counts / 4000 - 1 / 3) < 0.04), counts

    learner = DQNLearner(agent, make_kwargs(), total_env_steps=1000)  # re-points parameters into a flat buffer
    set_constant_q(agent.q_net, [0.0, 7.0, 0.0])
    agent.epsilon.fill_(0.0)
    assert learner.optimizer is not None
    assert set(agent.act_numpy(obs)[0].tolist()) == {1}


def test_n_step_transitions_bootstrap_with_gamma_to_the_steps_they_span():
    """An n-step transition's target discounts the bootstrap by gamma ** steps, not gamma."""
    agent = make_agent()
    learner = DQNLearner(agent, make_kwargs(n_step_return=3), total_env_steps=1000)
    set_constant_q(agent.q_net, ONLINE_Q)
    set_constant_q(learner.target, TARGET_Q)
    replay = RecordingReplay(100, OBS_SPACE, ACTION_SPACE, seed=0)
    obs = np.array([[0.1, 0.2], [0.3, 0.4]], np.float32)
    replay.add(obs, np.array([0, 1]), np.array([1.5, 0.5], np.float32), -obs, np.zeros(2, np.float32),
               steps=np.array([3.0, 2.0], np.float32))
    stats = learner.train(replay, gradient_steps=1, env_steps=500)
    batch = replay.last
    steps = batch.steps.numpy()
    target = batch.rewards.numpy() + GAMMA ** steps * max(TARGET_Q)
    td = target - np.array(ONLINE_Q)[batch.actions.numpy()]
    assert set(steps.tolist()) == {2.0, 3.0}
    assert stats["loss"] == pytest.approx(float(huber(td).mean()), rel=1e-5)


# --- the numpy acting path is pinned to act -----------------------------------------------------------------


def _dqn_rollout() -> tuple[QNetworkAgent, Fragment]:
    """One real rollout of a default DQN run on CartPole (its envs stepped in this process), before
    ``learning_starts``: ``act`` explores uniformly there."""
    from polar.config import RunConfig, validate
    from polar.models.policy import build_policy
    from polar.rollout.backends.base import make_backend

    cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"}, "policy": {"type": "dqn"}})
    torch.manual_seed(0)
    backend = make_backend(cfg, 64, seed=0)
    policy = build_policy(cfg, backend.observation_space, backend.action_space)
    try:
        backend.start(policy.state_dict(), 0, policy=policy)
        frag = backend.next_fragment()
    finally:
        backend.close()
    return policy.agent, frag


def test_editing_qnetwork_act_changes_the_dqn_rollouts_actions(monkeypatch):
    """A newcomer makes ``act`` greedy: the rollout's actions are then the argmax of Q at the observation each
    saw, not ``act_numpy``'s uniform exploration (rollouts acted through the numpy twin whatever ``act`` said)."""
    agent, frag = _dqn_rollout()
    with torch.no_grad():
        greedy = agent.q_net(torch.from_numpy(frag.obs.reshape(-1, frag.obs.shape[-1]))).argmax(-1).numpy()
    assert (frag.actions.reshape(-1) != greedy).mean() > 0.2  # the unedited run explores uniformly

    stock = QNetworkAgent.act

    def act(self, observation, internal_state=None, deterministic: bool = False):
        return stock(self, observation, internal_state, deterministic=True)

    monkeypatch.setattr(QNetworkAgent, "act", act)
    agent, frag = _dqn_rollout()
    with torch.no_grad():
        greedy = agent.q_net(torch.from_numpy(frag.obs.reshape(-1, frag.obs.shape[-1]))).argmax(-1).numpy()
    np.testing.assert_array_equal(frag.actions.reshape(-1), greedy)


def test_qnetwork_act_numpy_is_pinned_to_the_current_act():
    """``act_numpy`` is derived from ``act`` and ``q_values`` as they are: when either changes on purpose,
    re-derive ``act_numpy`` and set these values."""
    from polar.algorithms.ppo_fused import source_fingerprint

    now = {name: source_fingerprint(getattr(QNetworkAgent, name)) for name in QNetworkAgent.act_numpy_derived_from}
    assert now == QNetworkAgent.act_numpy_derived_from, f"QNetworkAgent.act_numpy_derived_from = {now}"

