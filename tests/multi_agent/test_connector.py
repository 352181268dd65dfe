"""The multi-agent connector protocol (protocol 2, docs/connector-protocol.md section 7) against real Node.js
processes: examples/node_connector/nim.js, and tests/multi_agent/bad_nim.js, which spoils one field of its replies.
Every bad frame is a one-line error naming the connector, the field and the agent."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from polar.config.base import validate
from polar.config.harness import ConnectorSpec
from polar.config.run import RunConfig
from polar.errors import ConfigError, ProtocolError

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "examples" / "node_connector"


def _env(script: Path, **config):
    from polar.harness.connector.multi_agent import ConnectorParallelEnv

    spec = ConnectorSpec(command=["node", str(script)], config=config, call_timeout_s=10, start_timeout_s=20)
    return ConnectorParallelEnv(spec, script.parent, seed=0)


def test_a_javascript_two_player_game_speaks_per_agent_observations_rewards_terminations_and_masks():
    env = _env(NODE / "nim.js", min_pile=2, max_pile=2, seed=3)
    try:
        assert env.possible_agents == ["first", "second"]
        assert env.action_space("first").n == 3
        assert set(env.observation_space("second").spaces) == {"observation", "action_mask"}
        obs, _ = env.reset(seed=1)
        assert list(obs) == ["first"]  # a turn-based game observes only the mover
        assert obs["first"]["observation"].argmax() == 2 and obs["first"]["action_mask"].tolist() == [1, 1, 0]
        obs, rewards, terms, truncs, _ = env.step({"first": 0})  # take 1 of 2
        assert list(obs) == ["second"] and obs["second"]["action_mask"].tolist() == [1, 0, 0]
        assert rewards == {"first": 0.0} and terms == {"first": False} and env.agents == ["first", "second"]
        obs, rewards, terms, truncs, _ = env.step({"second": 0})  # the last stone
        assert rewards == {"second": 1.0, "first": -1.0} and terms == {"second": True, "first": True}
        assert env.agents == [] and not any(truncs.values())
    finally:
        env.close()


@pytest.mark.parametrize(("bad", "message"), [
    ("reward_text", r"the step reply's 'rewards' for agent 'first' is 'lots', expected a finite number"),
    ("missing_terminated", r"the step reply's 'terminated' has no entry for agent 'first', which acted this step"),
    ("obs_shape", r"the step reply's 'obs' for agent 'second' has shape \(5,\), expected \(22,\)"),
    ("unknown_agent", r"the reset reply's 'obs' names agent 'ghost', which is not one of possible_agents"),
    ("mask_shape", r"the reset reply's 'action_masks' for agent 'first' has shape \(2,\), expected \(3,\)"),
    ("nobody", r"the step reply's 'obs' observes none of the live agents \['first', 'second'\]"),
])
def test_a_bad_frame_is_a_one_line_error_naming_the_field_and_the_agent(bad, message):
    env = _env(Path(__file__).parent / "bad_nim.js", bad=bad, min_pile=5, max_pile=5)
    try:
        with pytest.raises(ProtocolError, match=rf"^BadNim \(connector-0\): {message}") as err:
            env.reset(seed=0)
            env.step({"first": 0})
        assert "\n" not in str(err.value)
    finally:
        env.close()


def test_a_connector_process_that_dies_mid_game_stops_the_run_naming_it_and_the_message():
    from polar.errors import ConnectorCrashed

    env = _env(Path(__file__).parent / "bad_nim.js", bad="crash")
    try:
        env.reset(seed=0)
        with pytest.raises(ConnectorCrashed, match=r"^BadNim \(connector-0\) failed during 'step': the process died "
                                                   r"\(exit code 3\); multi-agent connectors are not restarted"):
            env.step({"first": 0})
    finally:
        env.close()


def test_a_single_agent_connector_under_the_multi_agent_harness_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"LineWalk is a single-agent connector .*run it with harness.type: custom"):
        _env(NODE / "line_walk.js")


def test_a_multi_agent_connector_under_the_single_agent_harness_is_refused_naming_it():
    from polar.harness.connector.vector_env import ConnectorVectorEnv

    spec = ConnectorSpec(command=["node", str(NODE / "nim.js")], start_timeout_s=20)
    with pytest.raises(ConfigError, match=r"Nim is a multi-agent connector .*harness: \{type: pettingzoo"):
        ConnectorVectorEnv(spec, 2, seed=0, config_dir=NODE)


def test_polar_trains_the_javascript_game_by_self_play_through_the_connector(tmp_path):
    """The fast path of tests/learning/test_nim_connector.py: a short run of the shipped example, its evaluation
    against a random player, and a per-policy export checked on the game's own observations."""
    from polar.config import load_config
    from polar.deploy.export import export_run
    from polar.trainers.build import build_trainer
    from polar.trainers.run_dir import RunDir

    cfg = load_config(NODE / "nim_selfplay.yaml", overrides=[
        "total_env_steps=100", "harness.self_play.eval_games=10", "distribution.envs_per_worker=2",
        "logging.progress_bar=false"])
    run = RunDir.create(cfg.name, tmp_path / "run", config_dir=cfg.config_dir)
    res = build_trainer(cfg, run).train()
    vs_random = res["eval"]["vs_random"]
    assert vs_random["games"] == 10 and sum(vs_random["learner"][k] for k in ("win", "draw", "loss")) == 10
    m = export_run(run.path, tmp_path / "export", samples=16, trust_code=True)
    assert m["policies"]["shared"]["agents"] == ["first", "second"]


def test_the_connector_config_is_one_of_id_and_connector_spec():
    with pytest.raises(ConfigError, match=r"give id .* or connector_spec .*, one of them"):
        validate(RunConfig, {"harness": {"type": "pettingzoo"}, "policy": {"type": "ppo"}})
    with pytest.raises(ConfigError, match=r"harness\.env_kwargs: a connector takes its settings in connector_spec\.config"):
        validate(RunConfig, {"harness": {"type": "pettingzoo", "connector_spec": {"command": ["node", "nim.js"]},
                                         "env_kwargs": {"a": 1}}, "policy": {"type": "ppo"}})


def test_a_run_folder_naming_a_multi_agent_connector_needs_trust_code_to_reopen():
    from polar.config import load_config
    from polar.config.trust import require_trust

    cfg = load_config(NODE / "nim_selfplay.yaml")
    with pytest.raises(ConfigError, match=r"names code that would run here: harness\.connector_spec\.command = 'node nim\.js'"):
        require_trust(cfg, "run R", trust_code=False)
    require_trust(cfg, "run R", trust_code=True)
