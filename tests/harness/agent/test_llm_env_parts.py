"""The LLM env agent's parts: text renderers, observation normalisers, action codecs and answer parsing."""

import json
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from polar.harness.llm_env.agent import (
    ActionCodec,
    InvalidAction,
    ObservationError,
    answer_value,
    observation_text,
    strip_ansi,
    window,
)
from polar.harness.llm_env.text_envs import renderer_for


def test_frozenlake_renderer_marks_the_agent_and_says_what_each_move_reaches():
    env = gym.make("FrozenLake-v1", is_slippery=False)
    obs, _ = env.reset(seed=0)
    r = renderer_for("FrozenLake-v1")
    text = r.render(env.unwrapped, obs)
    assert "P F F F\nF H F H\nF F F H\nH F F G" in text
    assert "row 1, column 1" in text and "left: wall" in text and "down: frozen" in text
    obs, *_ = env.step(1)  # down, to row 2 column 1: the hole H is to its right
    text = r.render(env.unwrapped, obs)
    assert "row 2, column 1" in text and "right: a hole" in text
    assert r.actions == ("left", "down", "right", "up")
    assert not r.success(False, 0.0, {}) and r.success(True, 1.0, {})


def test_taxi_blackjack_cliffwalking_renderers_read_the_env_state():
    taxi = gym.make("Taxi-v4")
    obs, _ = taxi.reset(seed=0)
    row, col, _, dest = taxi.unwrapped.decode(obs)
    text = renderer_for("Taxi-v4").render(taxi.unwrapped, obs)
    assert f"row {row + 1}, column {col + 1}" in text and f"destination is {'RGYB'[dest]}" in text
    bj = gym.make("Blackjack-v1")
    obs, _ = bj.reset(seed=3)
    text = renderer_for("Blackjack-v1").render(bj.unwrapped, obs)
    assert f"totals {obs[0]}" in text
    cw = gym.make("CliffWalking-v1")
    obs, _ = cw.reset(seed=0)
    text = renderer_for("CliffWalking-v1").render(cw.unwrapped, obs)
    assert "row 4, column 1" in text and "right: the cliff" in text and "up: safe ground" in text
    assert renderer_for("CartPole-v1") is None


def test_observation_normalisers_by_space():
    assert observation_text(3, spaces.Discrete(16)) == "state 3 (of 16)"
    assert json.loads(observation_text(np.array([0.5, -1.25], dtype=np.float32), spaces.Box(-2, 2, (2,)))) == [0.5, -1.25]
    d = spaces.Dict({"pos": spaces.Discrete(4), "vel": spaces.Box(-1, 1, (1,))})
    text = observation_text({"pos": 2, "vel": np.array([0.1])}, d)
    assert text.splitlines() == ["pos: state 2 (of 4)", "vel: [0.1]"]
    assert observation_text("a room with a door", None) == "a room with a door"
    assert json.loads(observation_text({"a": (1, 2)}, None, "json")) == {"a": [1, 2]}
    ansi = "\n\x1b[41mS\x1b[0mFFF\nFHFH\n"
    assert strip_ansi(ansi) == "[S]FFF\nFHFH"
    assert observation_text(None, None, "ansi", render=lambda: ansi) == "[S]FFF\nFHFH"


def test_observations_that_cannot_be_rendered_say_why():
    image = np.zeros((8, 8, 3), dtype=np.uint8)
    with pytest.raises(ObservationError, match="image_to_text"):
        observation_text(image, spaces.Box(0, 255, (8, 8, 3), np.uint8))
    assert observation_text(image, spaces.Box(0, 255, (8, 8, 3), np.uint8),
                            image_to_text=lambda a: f"a black {a.shape[0]}x{a.shape[1]} image") == "a black 8x8 image"
    with pytest.raises(ObservationError, match="NaN"):
        observation_text(np.array([np.nan]), spaces.Box(-1, 1, (1,)))
    with pytest.raises(ObservationError, match="render"):
        observation_text(None, None, "ansi", render=lambda: np.zeros((2, 2)))
    with pytest.raises(ObservationError, match="no text form"):
        observation_text(object(), None)


def test_action_codec_decodes_names_indices_and_refuses_out_of_range():
    codec = ActionCodec(spaces.Discrete(4), ["left", "down", "right", "up"])
    assert codec.describe() == "left, down, right, up"
    assert codec.decode("Right") == 2 and codec.decode(3) == 3 and codec.decode("1") == 1
    with pytest.raises(InvalidAction, match="out of range"):
        codec.decode(7)
    with pytest.raises(InvalidAction, match="choose one of: left, down, right, up"):
        codec.decode("jump")
    with pytest.raises(InvalidAction):
        codec.decode(True)
    box = ActionCodec(spaces.Box(-1, 1, (2,)))
    assert box.decode([0.5, -0.5]).tolist() == [0.5, -0.5]
    with pytest.raises(InvalidAction, match="out of range"):
        box.decode([2.0, 0.0])
    with pytest.raises(InvalidAction):
        box.decode([1.0])
    md = ActionCodec(spaces.MultiDiscrete([2, 3]))
    assert md.decode([1, 2]).tolist() == [1, 2]
    with pytest.raises(InvalidAction):
        md.decode([1, 3])
    with pytest.raises(Exception, match="Discrete\\(4\\)"):
        ActionCodec(spaces.Discrete(4), ["a", "b"])
    with pytest.raises(Exception, match="cannot describe"):
        ActionCodec(spaces.Tuple([spaces.Discrete(2)]))


def test_answer_formats_json_regex_and_function_call():
    assert answer_value("json", 'I will go right. {"action": "right"}', None) == "right"
    assert answer_value("json", '{"x": 1} then {"action": 2}', None) == 2
    with pytest.raises(InvalidAction, match="no JSON object"):
        answer_value("json", "go right", None)
    with pytest.raises(InvalidAction, match="empty"):
        answer_value("json", "", None)
    assert answer_value("regex", "Action: up\nAction: left", None, r"Action: (\w+)") == "left"
    with pytest.raises(InvalidAction, match="does not match"):
        answer_value("regex", "nothing", None, r"Action: (\w+)")
    call = SimpleNamespace(function=SimpleNamespace(name="act", arguments='{"action": "down"}'))
    assert answer_value("function_call", "", [call]) == "down"
    with pytest.raises(InvalidAction, match="no tool call"):
        answer_value("function_call", '{"action": "down"}', None)
    bad = SimpleNamespace(function=SimpleNamespace(name="act", arguments="{not json"))
    with pytest.raises(InvalidAction, match="not JSON"):
        answer_value("function_call", "", [bad])


def test_history_window_keeps_the_last_turns():
    steps = [[{"role": "user", "content": f"o{i}"}, {"role": "assistant", "content": f"a{i}"}] for i in range(4)]
    steps.append([{"role": "user", "content": "o4"}])
    full = window("sys", steps, None)
    assert [m["content"] for m in full] == ["sys", "o0", "a0", "o1", "a1", "o2", "a2", "o3", "a3", "o4"]
    assert [m["content"] for m in window("sys", steps, 1)] == ["sys", "o3", "a3", "o4"]
    assert [m["content"] for m in window("sys", steps, 0)] == ["sys", "o4"]
    assert [m["content"] for m in window("sys", steps, 10)] == [m["content"] for m in full]
