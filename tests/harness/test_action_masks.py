"""Gymnasium action masks (issue 36, point 2): honoured when acting, in evaluation and in PPO's loss.

The env (``tests.harness.masked_envs``) raises when a forbidden action is played and pays most for an
action that is usually forbidden, so a policy that ignores its mask crashes the run.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from polar.config.agent import BuiltinAgentConfig
from polar.config.base import validate
from polar.config.ppo import PPOKwargs
from polar.config.run import RunConfig
from polar.errors import AgentError, HarnessError
from polar.models.actor_critic import ActorCriticAgent

MOD = "tests.harness.masked_envs"


def _cfg(env_id: str, workers: int = 0, kwargs: dict | None = None, steps: int = 2048) -> RunConfig:
    return validate(RunConfig, {
        "harness": {"type": "gymnasium", "id": f"{MOD}:{env_id}", "kwargs": kwargs or {}},
        "policy": {"type": "ppo", "kwargs": {"n_steps": 128, "learning_rate": 3e-3}},
        "distribution": {"envs_per_worker": 4, "rollout_workers": workers}, "total_env_steps": steps,
        "logging": {"tensorboard": False, "checkpoint_freq": 0, "progress_bar": False},
        "eval": {"at_end": True, "episodes": 20, "deterministic": True}})


@pytest.mark.parametrize(("env_id", "workers"), [("PolarMaskedBandit-v0", 0), ("PolarInfoMaskedBandit-v0", 1)])
def test_masked_ppo_never_plays_an_illegal_action_in_training_or_evaluation(tmp_path, env_id, workers):
    from polar.trainers.build import compose
    from polar.trainers.run_dir import RunDir

    seen: list[dict] = []
    res = compose(_cfg(env_id, workers), RunDir.create("mask", tmp_path / "run"), on_iteration=seen.append).train()
    assert seen[-1]["env_steps"] >= 2048  # 2048+ masked steps played, none forbidden (the env raises on one)
    ev = res["eval"]
    assert ev["episodes"] == 20 and ev["return_mean"] >= 16.0  # 16 legal steps an episode
    assert np.isfinite(seen[-1]["entropy"]) and np.isfinite(seen[-1]["pg_loss"])


def _agent() -> tuple[ActorCriticAgent, gym.spaces.Dict]:
    from tests.harness.masked_envs import MaskedBandit

    space = MaskedBandit().observation_space
    torch.manual_seed(0)
    return ActorCriticAgent(space, gym.spaces.Discrete(5), BuiltinAgentConfig()), space


def _batch(n: int = 256):
    g = torch.Generator().manual_seed(1)
    mask = (torch.rand(n, 5, generator=g) < 0.5).to(torch.int8)
    mask[torch.arange(n), torch.randint(0, 5, (n,), generator=g)] = 1  # at least one legal action per row
    return {"observation": torch.rand(n, 5, generator=g) * 2 - 1, "action_mask": mask}


def test_masked_agent_acts_only_legal_actions_even_where_the_argmax_is_forbidden():
    agent, _ = _agent()
    with torch.no_grad():
        agent.pi_head.bias[4] = 50.0  # the unmasked argmax is always action 4
    obs = _batch()
    legal = obs["action_mask"].bool()
    for deterministic in (True, False):
        for _ in range(20):
            action, _, info = agent.act(obs, None, deterministic)
            assert legal[torch.arange(len(action)), action].all()
            assert torch.isfinite(info["log_prob"]).all()
    assert not agent.supports_act_numpy()  # the numpy acting path knows no masks: off for masked agents


def test_ppo_loss_log_prob_and_entropy_are_the_masked_categoricals():
    from polar.algorithms.ppo import PPOLearner

    agent, _ = _agent()
    obs = _batch()
    mask = obs["action_mask"].bool()
    actions = torch.multinomial(mask.float(), 1).squeeze(-1)
    logp, entropy, _ = agent.evaluate_actions(obs, actions)
    logits = agent.pi_head(agent.pi_encoder(obs))
    ref = torch.distributions.Categorical(logits=logits.masked_fill(~mask, float("-inf")))
    torch.testing.assert_close(logp, ref.log_prob(actions))
    torch.testing.assert_close(entropy, ref.entropy())
    (entropy.mean() - logp.mean()).backward()
    assert all(torch.isfinite(p.grad).all() for p in agent.parameters() if p.grad is not None)
    learner = PPOLearner(agent, PPOKwargs(), 1000)
    assert learner.path.startswith("autograd")  # the fused gradients are derived for the unmasked loss


def test_an_action_mask_that_allows_nothing_is_an_error_naming_the_env_and_the_step(tmp_path):
    from polar.trainers.build import compose
    from polar.trainers.run_dir import RunDir

    cfg = _cfg("PolarMaskedBandit-v0", kwargs={"empty_mask_at": 3})
    with pytest.raises(HarnessError, match=r"PolarMaskedBandit-v0: the action_mask at step 3 of episode 1 allows no action"):
        compose(cfg, RunDir.create("empty", tmp_path / "run")).train()


def test_a_forbidden_action_never_reaches_the_env():
    from polar.harness import make_env

    env = make_env(_cfg("PolarMaskedBandit-v0").harness)
    obs, _ = env.reset(seed=0)
    illegal = int(np.flatnonzero(obs["action_mask"] == 0)[0])
    with pytest.raises(AgentError, match=rf"PolarMaskedBandit-v0: action {illegal} at step 0 of episode 1 is forbidden"):
        env.step(illegal)
    assert env.unwrapped.illegal_played == 0


def test_an_exported_masked_policy_plays_only_legal_actions(tmp_path):
    """polar export of a masked run: the parity check copes with -inf logits, and the ONNX graph masks too."""
    import onnxruntime as ort

    from polar.deploy.export import export_run
    from polar.trainers.build import compose
    from polar.trainers.run_dir import RunDir

    cfg = _cfg("PolarMaskedBandit-v0", steps=256)
    run = RunDir.create("mask", tmp_path / "run")
    compose(cfg, run).train()
    export_run(run.path, tmp_path / "export", "onnx", trust_code=True)
    sess = ort.InferenceSession(str(tmp_path / "export" / "model.onnx"))
    obs = _batch(512)
    with torch.no_grad():
        obs["action_mask"][:, 4] = 1  # the usually-forbidden jackpot legal in some rows only
        obs["action_mask"][::2, 4] = 0
        obs["action_mask"][::2, 0] = 1  # and each row with one legal action at least
    for noise in (np.zeros((512, 5), np.float32), np.random.default_rng(0).gumbel(size=(512, 5)).astype(np.float32)):
        action, *_ = sess.run(None, {"obs.action_mask": obs["action_mask"].numpy().astype(np.int64),
                                     "obs.observation": obs["observation"].numpy(), "noise": noise})
        assert obs["action_mask"].bool()[torch.arange(512), torch.as_tensor(action)].all()
