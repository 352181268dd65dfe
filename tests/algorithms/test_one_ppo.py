"""One PPO: the clipped surrogate lives in one function, and a run with the default config learns from it.

The newcomer's test: edit ``clipped_surrogate`` (here: replace it, or swap its body) and the gradients of
a default-config PPO run change. The default run takes the fused path (hand-derived gradients) only while
the loss is the stock one it was derived from; an edited loss sends it through autograd, so it follows.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

import polar.algorithms.ppo as ppo_mod
from polar.algorithms import appo, grpo
from polar.algorithms.ppo import PPOLearner, clipped_surrogate, fused_pins, ppo_value_loss
from polar.algorithms.ppo_fused import DERIVED_FROM, pinned_fingerprints, source_fingerprint
from polar.config import RunConfig, validate
from polar.errors import ConfigError
from tests.algorithms.ppo_support import DEFAULT, one_rollout, update_grads


def _config(**kwargs):
    return validate(RunConfig, {**DEFAULT, "policy": {"type": "ppo", "kwargs": kwargs}})


@pytest.fixture(scope="module")
def default_rollout():
    """One real rollout of the default config (8 CartPole envs in-process, 128 steps each) and its initial weights."""
    cfg = _config()
    policy, frag = one_rollout(cfg)
    return cfg, policy, {k: v.clone() for k, v in policy.state_dict().items()}, frag


def _doubled(log_ratio, advantages, clip_range, clip_range_high=None):
    per_sample, ratio = clipped_surrogate(log_ratio, advantages, clip_range, clip_range_high)
    return 2.0 * per_sample, ratio


def _edited_body(log_ratio, advantages, clip_range, clip_range_high=None):
    """What a researcher might type into ``clipped_surrogate``: the stock body with a tighter clip."""
    ratio = torch.exp(log_ratio)
    return -torch.min(advantages * ratio, advantages * torch.clamp(ratio, 1.0 - 0.02, 1.0 + 0.02)), ratio


def test_editing_the_surrogate_changes_the_default_runs_gradients(default_rollout, monkeypatch):
    learner, base = update_grads(default_rollout)
    assert learner.fused, "the default config's built-in MLP should take the fused path"
    assert len(base) == 160 and base[0].abs().max() > 1e-4
    _, again = update_grads(default_rollout)
    assert all(torch.equal(a, b) for a, b in zip(base, again, strict=True))  # deterministic: a change is the edit's

    monkeypatch.setattr(ppo_mod, "clipped_surrogate", _doubled)  # replaced
    learner, doubled = update_grads(default_rollout)
    assert not learner.fused and "clipped_surrogate changed" in learner.path
    assert not torch.allclose(doubled[0], base[0])  # from the very first step

    monkeypatch.undo()
    monkeypatch.setattr(clipped_surrogate, "__code__", _edited_body.__code__)  # edited in place, same function object
    assert ppo_mod.clipped_surrogate is clipped_surrogate
    learner, tight = update_grads(default_rollout)
    assert not learner.fused
    torch.testing.assert_close(tight[0], base[0])  # ratio 1 on the first step: the clip does not bind yet
    assert max((t - b).abs().max().item() for t, b in zip(tight, base, strict=True)) > 1e-3  # then it does


def test_fused_and_autograd_paths_agree_on_the_default_run(default_rollout):
    fused_learner, fused = update_grads(default_rollout, "auto")
    auto_learner, autograd = update_grads(default_rollout, "off")
    assert fused_learner.fused and not auto_learner.fused
    for f, a in zip(fused[:20], autograd[:20], strict=True):  # later steps drift apart by float rounding
        torch.testing.assert_close(f, a, atol=1e-6, rtol=1e-4)


def test_the_fused_path_is_pinned_to_the_current_stock_code(default_rollout):
    """Fails when the pinned code is edited on purpose: re-derive ppo_fused.py (and act_numpy for an edit of
    act), then update DERIVED_FROM."""
    now = pinned_fingerprints(fused_pins(default_rollout[1].agent))
    assert now == DERIVED_FROM, (
        "the code the fused path stands for changed, so policy.kwargs.fused: auto now trains by autograd and acts "
        "through act. Re-derive polar/algorithms/ppo_fused.py (test_fused_gradients_equal_autograd checks it) or "
        f"ActorCriticAgent.act_numpy (test_numpy_rollout_path_matches_the_torch_agent), then set DERIVED_FROM = {now}")


def test_the_fingerprint_ignores_comments_and_docstrings_only():
    def documented():
        def f(x):
            """Doc."""
            return x + 1  # a comment
        return f

    def plain():
        def f(x):

            return x + 1
        return f

    def edited():
        def f(x):
            return x + 2
        return f

    assert source_fingerprint(documented()) == source_fingerprint(plain()) != source_fingerprint(edited())
    assert source_fingerprint(len) == "?"  # no Python source: never taken for the stock loss


def test_the_run_log_says_which_path_runs(default_rollout, caplog):
    cfg, policy, _, _ = default_rollout
    with caplog.at_level(logging.INFO, logger="polar.algorithms.ppo"):
        PPOLearner(policy.agent, cfg.policy.kwargs, 1)
        PPOLearner(policy.agent, cfg.policy.kwargs.model_copy(update={"fused": "off"}), 1)
    lines = [r.getMessage() for r in caplog.records if r.name == "polar.algorithms.ppo"]
    assert lines[0].startswith("PPO update path: fused (policy.kwargs.fused: auto; built-in MLP and the stock "
                               "autograd_step, evaluate_actions and act")
    assert lines[1] == "PPO update path: autograd (policy.kwargs.fused: off)"

    from gymnasium import spaces

    from polar.config.agent import BuiltinAgentConfig
    from polar.models import build_agent

    lstm = build_agent(BuiltinAgentConfig(type="lstm"), spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="polar.algorithms.ppo"):
        assert not PPOLearner(lstm, cfg.policy.kwargs, 1).fused
    assert "autograd (policy.kwargs.fused: auto; the agent is not the built-in MLP" in caplog.text


def test_fused_is_a_typed_option():
    assert _config().policy.kwargs.fused == "auto"
    assert _config(fused="off").policy.kwargs.fused == "off"
    with pytest.raises(ConfigError, match=r"policy\.kwargs\.fused.*'auto' or 'off'"):
        _config(fused="yes")


def test_appo_and_grpo_use_the_one_surrogate_and_ppos_value_loss():
    assert appo.clipped_surrogate is clipped_surrogate and grpo.clipped_surrogate is clipped_surrogate
    torch.manual_seed(0)
    new, old, adv = torch.randn(32) * 0.3, torch.randn(32) * 0.3, torch.randn(32)
    v, vs = torch.randn(32), torch.randn(32)
    out = appo.appo_loss(new, old, adv, v, vs, torch.zeros(32), clip_range=0.2, vf_coef=0.25, ent_coef=0.0)
    torch.testing.assert_close(out.policy_loss, clipped_surrogate(new - old, adv, 0.2)[0].mean())
    torch.testing.assert_close(out.value_loss, ppo_value_loss(v, None, vs, None))  # MSE, no 1/2
    g = grpo.grpo_loss(new[None], old[None], adv[None], torch.ones(1, 32), clip_range=0.2, clip_range_high=0.28)
    torch.testing.assert_close(g.loss, clipped_surrogate(new - old, adv, 0.2, 0.28)[0].mean())


def test_the_clip_is_written_once():
    """No loss clamps an importance ratio itself: they call ``clipped_surrogate``. ppo_fused.py holds its
    hand-derived gradient, used only while the surrogate is the stock one (pinned above)."""
    root = Path(ppo_mod.__file__).resolve().parents[1]
    writers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "clamp(ratio" in p.read_text())
    assert writers == ["algorithms/ppo.py", "algorithms/ppo_fused.py"]
