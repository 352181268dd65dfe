"""The LLM env agent through the real gateway and session pipeline, with scripted 'models' that read the
prompt the agent built: an oracle solves FrozenLake, garbage answers become recorded invalid actions, an
out-of-range action is repaired, an image observation with no image-to-text hook ERRORs with its reason."""

import json

import gymnasium as gym
import numpy as np
import pytest

from polar.config import load_config
from polar.harness.sessions import load_run_tasks, session_runner, session_verifier
from polar.inference import ScriptedEngine
from polar.inference.tiny import build_tiny_tokenizer
from polar.rollout.sessions.local import LocalStack
from polar.rollout.sessions.pipeline import PipelineSettings
from polar.rollout.sessions.session import SessionStatus
from tests.harness.agent.llm_helpers import frozenlake_move, last_user_turn, scripted

FROZENLAKE = """
harness: {type: gymnasium, id: FrozenLake-v1, kwargs: {map_name: 4x4, is_slippery: false}}
agent: {type: llm, max_steps: MAX_STEPS, random_map: true, invalid_action_penalty: -0.1, ACTION_FORMAT}
tasks: {source: seeds, start: 0, count: 3}
eval_tasks: {source: seeds, start: 1000, count: 3}
policy: {type: grpo}
"""


class ImageEnv(gym.Env):
    """Observations are RGB images: the LLM agent needs agent.image_to_text to see them."""

    observation_space = gym.spaces.Box(0, 255, (4, 4, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((4, 4, 3), np.uint8), {}

    def step(self, action):
        return np.zeros((4, 4, 3), np.uint8), 0.0, True, False, {}


gym.register("polar-test/ImageEnv-v0", entry_point=ImageEnv)


def _cfg(tmp_path, text, max_steps=12, action_format=""):
    path = tmp_path / "run.yaml"
    path.write_text(text.replace("MAX_STEPS", str(max_steps)).replace(", ACTION_FORMAT", action_format))
    return load_config(path)


def _run(cfg, answer, tmp_path, tasks=None):
    tok = build_tiny_tokenizer()
    engine = ScriptedEngine.tiny(scripted(tok, answer))
    settings = PipelineSettings(agent_timeout_s=120, session_budget_s=300, workspace_root=str(tmp_path / "ws"))
    with LocalStack(engine, session_runner(cfg), session_verifier(cfg), settings) as stack:
        groups = stack.run_groups([(t, 1, {}) for t in (tasks or load_run_tasks(cfg.tasks))], timeout_s=600)
    return [g[0] for g in groups], engine, tok


def test_an_oracle_solves_each_seeded_map_in_one_session_per_episode(tmp_path):
    cfg = _cfg(tmp_path, FROZENLAKE)
    results, engine, tok = _run(cfg, lambda text, i: json.dumps({"action": frozenlake_move(text)}), tmp_path)
    maps = set()
    for r in results:
        assert r.status == SessionStatus.DONE, r.error
        v = r.verifier_output
        assert r.reward == 1.0 and v["success"] and v["terminated"] and v["invalid_actions"] == 0
        assert v["calls"] == v["steps"] >= 6  # a 4x4 map needs at least 6 moves from S to G
        assert len(v["actions"]) == v["steps"] and set(v["actions"]) <= {0, 1, 2, 3}  # the env's own action ids
        assert len(r.samples) == 1 and r.trainable  # the whole episode is one prefix-merged sample
        maps.add(json.dumps(v["seed"]))
    prompts = [tok.decode(req.prompt_ids) for req in engine.requests]
    assert "Reach the goal G" in prompts[0] and "Available actions: left, down, right, up" in prompts[0]
    first_maps = {p.split("Map (")[1].split("You are")[0] for p in prompts if p.count("Step ") == 1}
    assert len(first_maps) == 3  # random_map: every seed has its own map


def test_answers_that_never_parse_are_recorded_invalid_actions_not_crashes(tmp_path):
    cfg = _cfg(tmp_path, FROZENLAKE, max_steps=3)
    results, engine, tok = _run(cfg, lambda text, i: "I like ice.", tmp_path)
    for r in results:
        assert r.status == SessionStatus.DONE, r.error
        v = r.verifier_output
        assert v["invalid_actions"] == 3 and v["steps"] == 3 and v["calls"] == 6  # one repair per step
        assert v["parse_failures"] == 6 and v["repaired"] == 0 and v["truncated"] and not v["success"]
        assert r.reward == pytest.approx(-0.3)
        assert v["invalid_reasons"][0].startswith("step 1: no JSON object")
        # step_advantage's view: three turns from the one start cell, two calls each, the penalty each
        assert [t["calls"] for t in v["turns"]] == [[0, 2], [2, 4], [4, 6]]
        assert len({t["state"] for t in v["turns"]}) == 1 and [t["reward"] for t in v["turns"]] == [-0.1] * 3
    turns = [last_user_turn(tok.decode(req.prompt_ids)) for req in engine.requests]
    assert sum("That is not a valid action: no JSON object" in t for t in turns) == 9  # 3 sessions x 3 steps
    assert sum("Your last answer was not a valid action, so nothing happened" in t for t in turns) == 6


def test_an_out_of_range_action_is_repaired_once(tmp_path):
    cfg = _cfg(tmp_path, FROZENLAKE)

    def answer(text, i):
        if "not a valid action" in last_user_turn(text):
            return json.dumps({"action": frozenlake_move(text)})
        return '{"action": 9}'

    results, _, _ = _run(cfg, answer, tmp_path, tasks=load_run_tasks(cfg.tasks)[:1])
    v = results[0].verifier_output
    assert results[0].status == SessionStatus.DONE and v["success"]
    assert v["invalid_actions"] == 0 and v["repaired"] == v["steps"] and v["calls"] == 2 * v["steps"]
    # each turn names its anchor state, the gateway calls it made (the ones its sampled tokens came from)
    # and its reward: what policy.kwargs.step_advantage credits turn by turn
    turns, r = v["turns"], results[0]
    assert [t["calls"] for t in turns] == [[2 * i, 2 * i + 2] for i in range(v["steps"])]
    sampled = sorted({c for s in r.samples for c, m in zip(s.call_indices, s.loss_mask, strict=True) if m})
    assert sampled == list(range(v["calls"]))
    assert len({t["state"] for t in turns}) == len(turns)  # the oracle's path never revisits a cell
    assert [t["reward"] for t in turns] == [0.0] * (len(turns) - 1) + [1.0] and r.reward == 1.0


def test_function_call_format_and_end_on_invalid(tmp_path):
    cfg = _cfg(tmp_path, FROZENLAKE, action_format=", action_format: function_call, on_invalid: end")

    def answer(text, i):
        if "Step 2." in text:
            return "no tool call here"
        call = json.dumps({"name": "act", "arguments": {"action": frozenlake_move(text)}})
        return f"<tool_call>\n{call}\n</tool_call>"

    results, engine, tok = _run(cfg, answer, tmp_path, tasks=load_run_tasks(cfg.tasks)[:1])
    r = results[0]
    assert r.status == SessionStatus.DONE, r.error
    v = r.verifier_output
    assert v["steps"] == 2 and v["invalid_actions"] == 1 and v["truncated"]  # the tool call stepped; then it ended
    assert '"name": "act"' in tok.decode(engine.requests[0].prompt_ids)  # the act tool is in the prompt


def test_an_observation_that_cannot_be_rendered_errors_with_its_reason(tmp_path):
    path = tmp_path / "img.yaml"
    path.write_text("""
harness: {type: gymnasium, id: polar-test/ImageEnv-v0}
agent: {type: llm}
tasks: {source: seeds, start: 0, count: 1}
policy: {type: grpo}
""")
    cfg = load_config(path)
    results, engine, _ = _run(cfg, lambda text, i: '{"action": 0}', tmp_path)
    r = results[0]
    assert r.status == SessionStatus.ERROR and not r.trainable
    assert "observation at step 0 cannot be rendered" in r.error and "agent.image_to_text" in r.error
    assert not engine.requests  # nothing was asked of the model


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(Exception, match=r"share seeds 2\.\.2"):
        _cfg(tmp_path, FROZENLAKE.replace("start: 1000", "start: 2"))
    with pytest.raises(Exception, match="action_regex"):
        _cfg(tmp_path, FROZENLAKE, action_format=", action_format: regex")
    path = tmp_path / "taxi.yaml"
    path.write_text("""
harness: {type: gymnasium, id: Taxi-v4}
agent: {type: llm, random_map: true}
tasks: {source: seeds, count: 2}
policy: {type: grpo}
""")
    with pytest.raises(Exception, match=r"agent\.random_map is for FrozenLake"):
        session_runner(load_config(path))


class TupleActionEnv(ImageEnv):
    action_space = gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Discrete(2)])


gym.register("polar-test/TupleActionEnv-v0", entry_point=TupleActionEnv)


def test_a_task_without_a_seed_and_an_undescribable_action_space(tmp_path):
    cfg = _cfg(tmp_path, FROZENLAKE)
    results, engine, _ = _run(cfg, lambda text, i: '{"action": 0}', tmp_path, tasks=[{"id": "t1", "prompt": "go"}])
    assert results[0].status == SessionStatus.ERROR and "task 't1' has no integer 'seed'" in results[0].error
    assert not engine.requests
    path = tmp_path / "tuple.yaml"
    path.write_text("harness: {type: gymnasium, id: polar-test/TupleActionEnv-v0}\nagent: {type: llm}\n"
                    "tasks: {source: seeds, count: 1}\npolicy: {type: grpo}\n")
    with pytest.raises(Exception, match=r"agent\.type llm on polar-test/TupleActionEnv-v0: .*cannot describe"):
        session_runner(load_config(path))


def test_reward_shaping_adds_to_the_episode_return(tmp_path):
    cfg = _cfg(tmp_path, FROZENLAKE, action_format=(
        ", reward: {scale: 2.0, step_penalty: -0.01, success_bonus: 0.25,"
        " function: 'tests.harness.agent.llm_helpers:bonus_on_goal'}"))
    results, _, _ = _run(cfg, lambda text, i: json.dumps({"action": frozenlake_move(text)}), tmp_path,
                         tasks=load_run_tasks(cfg.tasks)[:1])
    v = results[0].verifier_output
    assert v["success"] and v["env_return"] == 1.0
    assert results[0].reward == pytest.approx(2.0 - 0.01 * v["steps"] + 0.25 + 0.5)


def test_a_spent_session_budget_stops_the_episode_and_its_engine_calls(tmp_path):
    """The pipeline cancels the runner when the budget runs out; the episode task under it must stop too, not
    keep stepping the env and calling the engine for a session that already ended."""
    import time

    cfg = _cfg(tmp_path, FROZENLAKE, max_steps=400)
    tok = build_tiny_tokenizer()
    engine = ScriptedEngine.tiny(scripted(tok, lambda text, i: json.dumps({"action": "left"})), token_delay_s=0.05)
    settings = PipelineSettings(agent_timeout_s=120, session_budget_s=6.0, workspace_root=str(tmp_path / "ws"))
    with LocalStack(engine, session_runner(cfg), session_verifier(cfg), settings) as stack:
        [[result]] = stack.run_groups([(load_run_tasks(cfg.tasks)[0], 1, {})], timeout_s=60)
        calls_at_end = len(engine.requests)
        time.sleep(2.0)  # an episode left running would make several more calls by now
        calls_later = len(engine.requests)
    assert "session budget of 6.0s ran out" in (result.error or ""), result.error
    assert 1 <= calls_at_end < 400
    assert calls_later <= calls_at_end + 1  # at most the call that was in flight
