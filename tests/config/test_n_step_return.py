"""``n_steps`` means one thing: env steps per env in a fragment (PPO, APPO). DQN's and SAC's n-step return is
``n_step_return``; an old config with ``n_steps`` there is refused with the key it meant."""

from __future__ import annotations

import pytest

from polar.config import RunConfig, load_config, validate
from polar.errors import ConfigError


@pytest.mark.parametrize("algo, env_id", [("dqn", "CartPole-v1"), ("sac", "Pendulum-v1")])
def test_an_old_off_policy_config_with_n_steps_gets_did_you_mean_n_step_return(algo, env_id, tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(f"harness: {{type: gymnasium, id: {env_id}}}\npolicy: {{type: {algo}, kwargs: {{n_steps: 3}}}}\n")
    with pytest.raises(ConfigError, match=rf"policy\.kwargs\.n_steps: {algo} has no n_steps .*did you mean "
                                          r"n_step_return"):
        load_config(str(path))


@pytest.mark.parametrize("algo, env_id", [("dqn", "CartPole-v1"), ("sac", "Pendulum-v1")])
def test_n_step_return_is_the_off_policy_horizon_and_n_steps_stays_ppos(algo, env_id):
    cfg = validate(RunConfig, {"harness": {"type": "gymnasium", "id": env_id},
                               "policy": {"type": algo, "kwargs": {"n_step_return": 3}}})
    assert cfg.policy.kwargs.n_step_return == 3 and not hasattr(cfg.policy.kwargs, "n_steps")
    ppo = validate(RunConfig, {"harness": {"type": "gymnasium", "id": "CartPole-v1"},
                               "policy": {"type": "ppo", "kwargs": {"n_steps": 32}}})
    assert ppo.policy.kwargs.n_steps == 32
