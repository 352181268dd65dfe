import pytest
import torch

from polar.algorithms.grpo import group_advantages, grpo_loss, token_logprobs
from polar.algorithms.sft import sft_loss


def test_group_advantages():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    a = group_advantages(r, "mean_std")
    assert torch.allclose(a, torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-4)
    loo = group_advantages(torch.tensor([1.0, 0.0, 0.0]), "leave_one_out")
    assert torch.allclose(loo, torch.tensor([1.0, -0.5, -0.5]))
    assert torch.all(group_advantages(torch.tensor([0.3, 0.3, 0.3])) == 0)
    assert torch.all(group_advantages(torch.tensor([0.3, 0.3]), "leave_one_out") == 0)


def test_loss_on_policy_is_minus_advantage_and_masks_apply():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    out = grpo_loss(logp, logp.clone(), torch.tensor([2.0]), mask)
    assert abs(out.loss.item() + 2.0) < 1e-6 and out.clip_fraction == 0.0 and abs(out.ratio_mean - 1) < 1e-6
    # masked tokens carry no gradient
    lp = logp.clone().requires_grad_(True)
    grpo_loss(lp, logp.detach(), torch.tensor([1.0]), mask).loss.backward()
    assert lp.grad[0, 0] == 0 and lp.grad[0, 1] != 0


def test_clipping_stops_gradient_beyond_the_trust_region():
    old = torch.zeros(1, 2)
    new = torch.tensor([[0.0, 0.5]], requires_grad=True)  # ratio e^0.5 = 1.65 > 1.2 on token 1
    out = grpo_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2), clip_range=0.2)
    out.loss.backward()
    assert new.grad[0, 1] == 0 and new.grad[0, 0] != 0 and out.clip_fraction == 0.5
    # with a negative advantage the pessimistic (unclipped) term keeps the gradient
    new2 = torch.tensor([[0.0, 0.5]], requires_grad=True)
    grpo_loss(new2, old, torch.tensor([-1.0]), torch.ones(1, 2), clip_range=0.2).loss.backward()
    assert new2.grad[0, 1] != 0


def test_kl_penalty_is_zero_at_reference_and_positive_away():
    ref = torch.log(torch.tensor([[0.5, 0.5]]))
    same = grpo_loss(ref.clone(), ref, torch.tensor([0.0]), torch.ones(1, 2), ref_logprobs=ref, kl_coef=1.0)
    assert abs(same.kl) < 1e-7
    away = grpo_loss(ref - 0.3, ref - 0.3, torch.tensor([0.0]), torch.ones(1, 2), ref_logprobs=ref, kl_coef=1.0)
    assert away.kl > 0 and away.loss.item() > 0


def test_gradient_accumulation_equals_full_batch():
    torch.manual_seed(0)
    logits = torch.randn(4, 6, 11, requires_grad=True)
    ids = torch.randint(0, 11, (4, 6))
    mask = (torch.rand(4, 6) > 0.3).float()
    old = torch.randn(4, 6) * 0.1 - 2
    adv = torch.randn(4)
    n = float(mask.sum())
    full = grpo_loss(token_logprobs(logits, ids), old, adv, mask, normalizer=n).loss
    (g_full,) = torch.autograd.grad(full, logits)
    acc = torch.zeros_like(logits)
    for s in (slice(0, 1), slice(1, 4)):
        part = grpo_loss(token_logprobs(logits[s], ids[s]), old[s], adv[s], mask[s], normalizer=n).loss
        acc[s] += torch.autograd.grad(part, logits)[0][s]
    assert torch.allclose(acc, g_full, atol=1e-6)


def test_sft_loss_counts_only_targets():
    logits = torch.zeros(1, 3, 4)
    ids = torch.tensor([[0, 1, 2]])
    loss = sft_loss(logits, ids, torch.tensor([[0, 0, 1]]))
    assert abs(loss.item() - torch.log(torch.tensor(4.0)).item()) < 1e-6


def test_group_batch_drops_stale_groups_error_sessions_and_flat_groups():
    from polar.algorithms.grpo import group_batch
    from polar.rollout.sessions.session import SessionResult, SessionStatus
    from polar.types import TrajectorySample

    def res(reward, version, status=SessionStatus.DONE, i=0):
        s = TrajectorySample("s", [1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], [version] * 3, [0] * 3, reward,
                             metadata={"min_policy_version": version})
        return SessionResult(f"s{i}", "t", "g", i, status, reward=reward, samples=[s])

    fresh = [res(1.0, 4, i=0), res(0.0, 4, i=1), res(None, 4, SessionStatus.ERROR, i=2)]
    stale = [res(1.0, 3, i=0), res(0.0, 3, i=1)]
    flat = [res(1.0, 5, i=0), res(1.0, 5, i=1)]
    samples, advs, stats = group_batch([fresh, stale, flat], current_version=5, max_off_policy_steps=1,
                                       advantage="mean_std")
    assert len(samples) == 2 and advs[0] > 0 > advs[1]  # only the fresh group, without its ERROR session
    assert stats["groups_stale"] == 1 and stats["groups_no_signal"] == 1 and stats["sessions_error"] == 1
    assert stats["groups_signal_share"] == 1 / 3  # one of the three groups carried a signal


def test_group_batch_keeps_tied_groups_below_the_best_reward_at_advantage_zero_for_the_kl():
    from polar.algorithms.grpo import best_reward, group_batch, reward_range
    from polar.rollout.sessions.session import SessionResult, SessionStatus
    from polar.types import TrajectorySample

    def res(reward, i, group):
        s = TrajectorySample(f"{group}{i}", [1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], [0] * 3, [0] * 3, reward,
                             metadata={"min_policy_version": 0})
        return SessionResult(f"{group}{i}", group, group, i, SessionStatus.DONE, reward=reward, samples=[s])

    signal = [res(1.0, 0, "a"), res(0.0, 1, "a")]
    tied = [res(0.0, 0, "b"), res(0.0, 1, "b"), res(0.0, 2, "b")]
    dropped, _, stats = group_batch([signal, tied], 0, 0, "mean_std")
    assert [s.session_id for s in dropped] == ["a0", "a1"] and stats["groups_no_signal"] == 1
    seen = reward_range([signal, tied], None)
    assert seen == (0.0, 1.0) and best_reward(seen) == 1.0
    best = best_reward(seen)
    kept, advs, stats = group_batch([signal, tied], 0, 0, "mean_std", best=best, keep_tied=True)
    assert [s.session_id for s in kept] == ["a0", "a1", "b0", "b1", "b2"]
    assert advs[0] > 0 > advs[1] and advs[2:] == [0.0, 0.0, 0.0]
    assert stats["groups_no_signal"] == 1 and stats["groups_tied_kept"] == 1 and stats["groups_used"] == 1
    assert stats["groups_signal_share"] == 0.5  # a kept tied group still carries no signal

    # every session reached the best outcome seen (a converged policy): no KL-only step pulls it back
    solved = [res(1.0, 0, "c"), res(1.0, 1, "c")]
    seen = reward_range([solved], seen)
    assert seen == (0.0, 1.0)
    samples, _, stats = group_batch([solved], 0, 0, "mean_std", best=best_reward(seen), keep_tied=True)
    assert samples == [] and stats["groups_tied_at_best"] == 1 and stats.get("groups_tied_kept", 0) == 0
    # the same tie after a better reward was seen (a policy that fell back onto a worse answer) keeps the KL
    samples, _, stats = group_batch([solved], 0, 0, "mean_std", best=best_reward(reward_range([solved], (0.0, 2.0))),
                                    keep_tied=True)
    assert [s.session_id for s in samples] == ["c0", "c1"] and stats["groups_tied_kept"] == 1
    # without a KL term a tie at the best is counted all the same (the low-signal warning leaves it out)
    samples, _, stats = group_batch([solved, tied], 0, 0, "mean_std", best=1.0)
    assert samples == [] and stats["groups_tied_at_best"] == 1 and stats["groups_no_signal"] == 2
    # the best is over usable sessions: an ERROR session's reward does not count
    failed = SessionResult("c2", "c", "c", 2, SessionStatus.ERROR, reward=5.0, samples=[])
    assert reward_range([[*solved, failed]], None) == (1.0, 1.0) and reward_range([], None) is None
    # a run where every reward so far is the same has no best yet: its ties are not convergence
    assert best_reward(reward_range([tied], None)) is None and best_reward(None) is None


def test_heldout_success_uses_the_verifiers_verdict_not_a_shaped_reward():
    from polar.evaluation.metrics import get_metric
    from polar.evaluation.suite import MetricSpec
    from polar.rollout.sessions.session import SessionResult, SessionStatus
    from polar.rollout.sessions.stats import success_rate

    def result(i, reward, status=SessionStatus.DONE, **verdict):
        return SessionResult(session_id=f"s{i}", task_id="t", group_id="t", sample_index=i, status=status,
                             reward=reward, verifier_output=verdict)

    # an LLM env agent with shaping: positive returns that never reached the goal, and one that did
    env_group = [result(0, 0.33, success=False), result(1, 0.17, success=False), result(2, 1.0, success=True),
                 result(3, None, SessionStatus.ERROR)]
    out = success_rate([env_group])
    assert out["success"] == 0.25 and abs(out["reward_mean"] - 1.5 / 4) < 1e-9
    assert out["sessions"] == 4 and out["errors"] == 1
    # a verifier without a verdict (a reasoning-gym score): success is still the mean reward
    scored = success_rate([[result(0, 0.5), result(1, 1.0)]])
    assert scored["success"] == scored["reward_mean"] == 0.75
    # polar eval --suite's success_rate reads the same verdict
    metric, spec = get_metric("success_rate"), MetricSpec(name="success_rate", success_threshold=0.1)
    assert metric.value({"status": "done", "reward": 0.33, "success": False}, spec) == 0.0
    assert metric.value({"status": "done", "reward": 0.33, "success": None}, spec) == 1.0
    assert metric.value({"status": "error", "reward": None, "success": True}, spec) == 0.0


def test_step_advantages_compare_turns_from_the_same_state_by_their_return_to_go():
    from polar.algorithms.grpo import step_advantages

    # two episodes leave state "a" differently: one steps to "b" and on (+1 then +1), one falls (-1)
    episodes = [[("a", 1.0), ("b", 1.0)], [("a", -1.0)], [("c", 0.5)]]
    advs = step_advantages(episodes, gamma=0.5, normalize="none")
    g_good, g_bad = 1.0 + 0.5 * 1.0, -1.0  # return-to-go from "a" in each episode
    mean = (g_good + g_bad) / 2
    assert advs[0][0] == pytest.approx(g_good - mean) and advs[1][0] == pytest.approx(g_bad - mean)
    assert advs[0][1] == 0.0 and advs[2] == [0.0]  # "b" and "c" are visited once: nothing to compare
    std = step_advantages(episodes, gamma=0.5)
    assert std[0][0] == pytest.approx(1.0, abs=1e-5) and std[1][0] == pytest.approx(-1.0, abs=1e-5)
    # a state visited twice within one episode is a step group too; equal returns there teach nothing
    assert step_advantages([[("a", 0.0), ("a", 1.0)]], gamma=0.5, normalize="none") == [[-0.25, 0.25]]
    assert step_advantages([[("a", 1.0)], [("a", 1.0)]]) == [[0.0], [0.0]]
    with pytest.raises(ValueError, match="'std' or 'none'"):
        step_advantages(episodes, normalize="rank")


def test_group_batch_with_step_advantage_gives_each_turns_tokens_its_own_credit():
    from polar.algorithms.grpo import group_batch
    from polar.config.grpo import StepAdvantageConfig
    from polar.rollout.sessions.session import SessionResult, SessionStatus
    from polar.types import TrajectorySample

    def res(i, reward, turns):
        # one prefix-merged sample: call 0's prompt and answer, call 1's prompt tail and answer
        s = TrajectorySample(f"s{i}", [1, 2, 3, 4, 5, 6], [0, 1, 1, 0, 1, 1], [0.0] * 6, [0] * 6, [0, 0, 0, 1, 1, 1],
                             reward)
        return SessionResult(f"s{i}", "t", "g", i, SessionStatus.DONE, reward=reward, samples=[s],
                             verifier_output={"turns": turns})

    # the same return (0), so the episode advantages are 0; but from state "x" one went on and one fell
    tied = [res(0, 0.0, [{"state": "s0", "calls": [0, 1], "reward": 0.5}, {"state": "x", "calls": [1, 2], "reward": -0.5}]),
            res(1, 0.0, [{"state": "s0", "calls": [0, 1], "reward": -0.5}, {"state": "x", "calls": [1, 2], "reward": 0.5}])]
    samples, advs, stats = group_batch([tied], 0, 0, "mean_std", StepAdvantageConfig(gamma=1.0, normalize="none"))
    assert stats["groups_used"] == 1 and stats["turns"] == 4 and len(samples) == 2
    assert advs[0] == [0.0, 0.0, 0.0, 0.0, -0.5, -0.5]  # call 0: G(s0) ties at 0; call 1 (from x): -0.5 vs +0.5
    assert advs[1] == [0.0, 0.0, 0.0, 0.0, 0.5, 0.5]
    # without step_advantage the tied group teaches nothing
    samples, _, stats = group_batch([tied], 0, 0, "mean_std")
    assert samples == [] and stats["groups_no_signal"] == 1


def test_step_advantage_config_is_refused_where_it_has_no_turns(tmp_path):
    from polar.config import load_config
    from polar.errors import ConfigError

    agent_run = tmp_path / "agent.yaml"
    agent_run.write_text("harness: {type: agent, command: ['true']}\ntasks: {source: seeds, start: 0, count: 2}\n"
                         "verifier: {type: none}\npolicy: {type: grpo, kwargs: {step_advantage: {}}}\n")
    with pytest.raises(ConfigError, match="only the built-in LLM agent reports"):
        load_config(agent_run)
    with_critic = tmp_path / "critic.yaml"
    with_critic.write_text("harness: {type: gymnasium, id: FrozenLake-v1}\nagent: {type: llm}\n"
                           "tasks: {source: seeds, start: 0, count: 2}\n"
                           "policy: {type: grpo, kwargs: {advantage: value_head, step_advantage: {}}}\n")
    with pytest.raises(ConfigError, match="use one of them"):
        load_config(with_critic)


def test_low_signal_warning_leaves_out_groups_tied_at_the_best_reward(caplog):
    """A converged step (every group tied at the best reward seen) is not a missing signal: no advice to
    enlarge the group; a step whose groups tied below the best still gets it."""
    from types import SimpleNamespace

    from polar.algorithms.grpo import GRPOLearner

    learner = SimpleNamespace(_low_signal_steps=0, kw=SimpleNamespace(group_size=16))
    warn = GRPOLearner.warn_on_low_signal
    with caplog.at_level("WARNING", logger="polar.algorithms.grpo"):
        warn(learner, {"groups": 2, "groups_used": 0, "groups_no_signal": 2, "groups_tied_at_best": 2}, 27)
        assert not caplog.records and learner._low_signal_steps == 0
        warn(learner, {"groups": 2, "groups_used": 0, "groups_no_signal": 2, "groups_tied_at_best": 1}, 27)
    assert len(caplog.records) == 1 and "only 0% of the groups carry a signal" in caplog.text
