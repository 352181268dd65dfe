"""The universal action set (``agent.action_format: universal``): parsing every form of click / type /
press_key / call_api (and the clear errors of malformed ones), each built-in translator, FrozenLake played
through press_key and a WebShop-like text env through call_api with scripted models on the real session
pipeline, and the config errors of a bad translator."""

import json
import re

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from polar.config import load_config
from polar.config.llm_agent import BUILTIN_TRANSLATORS
from polar.errors import HarnessError
from polar.harness.llm_env.agent import InvalidAction, answer_value, format_hint, system_prompt
from polar.harness.llm_env.universal import (
    BUILTIN,
    CallApi,
    Click,
    CommandTranslator,
    GridTranslator,
    KeyTranslator,
    PressKey,
    TextTranslator,
    Type,
    auto_translator,
    build_translator,
    parse_universal,
)
from polar.harness.sessions import load_run_tasks, session_runner
from polar.rollout.sessions.session import SessionStatus
from tests.harness.agent.llm_helpers import frozenlake_move, last_user_turn
from tests.harness.agent.test_llm_env_sessions import _run

FL_NAMES = ["left", "down", "right", "up"]
PRINTABLE = "".join(chr(c) for c in range(32, 127))

# ---- parsing ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "action"), [
    ('{"action": "click", "x": 3, "y": 4}', Click(3, 4)),
    ('{"action": "type", "text": "hello world"}', Type("hello world")),
    ('{"action": "press_key", "key": "left"}', PressKey("left")),
    ('{"action": "call_api", "name": "search", "params": {"q": "shoes"}}', CallApi("search", {"q": "shoes"})),
    ('{"action": "call_api", "name": "ping"}', CallApi("ping", {})),
    ('{"action": "Press_Key", "key": "up"}', PressKey("up")),  # the kind is case-insensitive
    ('{"action": "press_key(\\"down\\")"}', PressKey("down")),  # a whole call as the JSON action
    ("click(3, 4)", Click(3, 4)),
    ("click(x=0.5, y=2)", Click(0.5, 2)),
    ('type("hello) world")', Type("hello) world")),  # a ")" inside the string does not end the call
    ("type('')", Type("")),
    ('press_key("left")', PressKey("left")),
    ('call_api("search", {"q": "shoes", "new": true})', CallApi("search", {"q": "shoes", "new": True})),
    ('call_api(name="ping")', CallApi("ping", {})),
    ('The hole is left, so I go down.\npress_key("down")', PressKey("down")),
    ('first press_key("up"), no: press_key("right")', PressKey("right")),  # the last call decides
    ('{"action": "press_key", "key": "up"} and then press_key("left")', PressKey("up")),  # JSON before a call
    ('{"thought": {"a": 1}} {"action": "click", "x": 1, "y": 2}', Click(1, 2)),
])
def test_every_form_of_every_action_parses(answer, action):
    assert parse_universal(answer) == action


def test_actions_write_themselves_as_calls_and_json():
    a = CallApi("search", {"q": "shoes"})
    assert str(a) == 'call_api("search", {"q": "shoes"})' and a.as_json() == {
        "action": "call_api", "name": "search", "params": {"q": "shoes"}}
    for action in (Click(3, 4), Type('say "hi"'), PressKey("enter"), a):  # both forms parse back
        assert parse_universal(str(action)) == action == parse_universal(json.dumps(action.as_json()))


@pytest.mark.parametrize(("answer", "reason"), [
    ("", "the answer is empty"),
    ("I will go left.", "no action in the answer; end it with one of click(x, y), type(text), press_key(key)"),
    ('{"action": "left"}', "'left' is not a universal action; use one of click(x, y)"),
    ('{"action": 3}', "3 is not a universal action"),
    ('{"action": "click", "x": 1}', "click(x, y) is missing y"),
    ('{"action": "click", "x": 1, "y": 2, "button": "left"}', "click(x, y) has no parameter 'button'"),
    ('{"action": "click", "x": "1", "y": 2}', "click: x must be a number, not '1'"),
    ('{"action": "click", "x": NaN, "y": 2}', "click: x must be a number, not nan"),
    ("click(3,", "'click(3,' is not a complete call; write it like click(x, y)"),
    ('press_key("up") then click(3,', "is not a complete call"),  # a cut-off last call is no fallback
    ("click(x, y)", "x is not a literal value"),
    ("click(1, 2, 3)", "click(x, y) takes 2 argument(s), got 3"),
    ("click(1, x=2)", "got x twice"),
    ("click(*xs)", "(no * or **)"),
    ("click(True, 2)", "x must be a number, not True"),
    ("type(5)", "type: text must be a string, not 5"),
    ('press_key("  ")', "press_key: key must be a non-empty string"),
    ('call_api("search", ["shoes"])', "call_api: params must be a JSON object"),
    ('call_api("", {})', "call_api: name must be a non-empty string"),
])
def test_malformed_answers_say_what_is_wrong(answer, reason):
    with pytest.raises(InvalidAction) as e:
        parse_universal(answer)
    assert reason in str(e.value)


def test_the_json_format_reads_nested_objects_with_the_shared_extractor():
    # the old flat-object regex found only {"a": 1} here and reported no action
    assert answer_value("json", 'ok {"action": [1, 2], "why": {"a": 1}}', None) == [1, 2]
    assert answer_value("json", '{"action": "up"} {broken {"action": "left"}', None) == "left"


# ---- translators --------------------------------------------------------------------------------------


def test_keys_translator_presses_named_discrete_actions():
    t = KeyTranslator(spaces.Discrete(4), FL_NAMES)
    assert t.translate(PressKey("Left")) == 0 and t.translate(PressKey("up")) == 3
    assert t.describe() == "press_key(key) with key one of left, down, right, up"
    with pytest.raises(InvalidAction, match=r"press_key\(\"jump\"\): 'jump' is not an action; choose one of: left, "):
        t.translate(PressKey("jump"))
    with pytest.raises(InvalidAction, match=r"click\(1, 2\) does not apply here; this env takes press_key\(key\)"):
        t.translate(Click(1, 2))
    unnamed = KeyTranslator(spaces.Discrete(3, start=1))
    assert unnamed.keys == ["1", "2", "3"] and unnamed.translate(PressKey("2")) == 2
    with pytest.raises(InvalidAction, match="out of range"):
        unnamed.translate(PressKey("0"))
    with pytest.raises(HarnessError, match="needs a Discrete"):
        KeyTranslator(spaces.Box(0, 1, (2,)))


def test_text_translator_types_strings_and_configured_keys():
    t = TextTranslator(spaces.Text(20, charset=PRINTABLE), keys={"Enter": "submit"})
    assert t.translate(Type("red shoes")) == "red shoes" and t.translate(PressKey("ENTER")) == "submit"
    assert t.describe() == "type(text) with 1 to 20 characters; press_key(key) with key one of enter"
    with pytest.raises(InvalidAction, match="is 25 characters; this env takes 1 to 20"):
        t.translate(Type("x" * 25))
    with pytest.raises(InvalidAction, match="no such key here; press one of: enter"):
        t.translate(PressKey("tab"))
    with pytest.raises(InvalidAction, match="does not apply here"):
        t.translate(Click(0, 0))
    plain = TextTranslator(spaces.Text(10))  # gymnasium's default charset: letters and digits only
    with pytest.raises(InvalidAction, match="characters this env does not take: ' !'"):
        plain.translate(Type("hi there!"))
    with pytest.raises(InvalidAction, match="does not apply here"):
        plain.translate(PressKey("enter"))  # no keys configured
    with pytest.raises(HarnessError, match="keys must map names to strings"):
        TextTranslator(spaces.Text(10), keys={"enter": 13})
    with pytest.raises(HarnessError, match="needs a Text action space"):
        TextTranslator(spaces.Discrete(2))


def test_grid_translator_clicks_inside_the_bounds():
    grid = GridTranslator(spaces.MultiDiscrete([4, 3]))
    out = grid.translate(Click(3, 2))
    assert out.tolist() == [3, 2] and out.dtype == np.int64
    assert grid.describe() == "click(x, y) with integers x from 0 to 3 and y from 0 to 2"
    with pytest.raises(InvalidAction, match=r"click\(4, 0\) is off the grid; click\(x, y\) with integers x from 0 to 3"):
        grid.translate(Click(4, 0))
    with pytest.raises(InvalidAction, match="must be integers"):
        grid.translate(Click(1.5, 0))
    with pytest.raises(InvalidAction, match="does not apply here"):
        grid.translate(Type("a"))
    screen = GridTranslator(spaces.Box(0.0, 1.0, (2,), np.float32))
    out = screen.translate(Click(0.5, 0.25))
    assert out.tolist() == [0.5, 0.25] and out.dtype == np.float32
    with pytest.raises(InvalidAction, match="off the grid"):
        screen.translate(Click(0.5, 1.5))
    with pytest.raises(HarnessError, match="finite bounds"):
        GridTranslator(spaces.Box(-np.inf, np.inf, (2,)))
    with pytest.raises(HarnessError, match=r"shape \(2,\)"):
        GridTranslator(spaces.MultiDiscrete([4, 4, 4]))


def test_command_translator_maps_api_calls_through_its_table():
    space = spaces.Text(60, charset=PRINTABLE)
    t = CommandTranslator(space, table={"search": "search[{query}]", "click": "click[{target}]"})
    assert t.translate(CallApi("search", {"query": "red shoes"})) == "search[red shoes]"
    assert t.translate(CallApi("Click", {"target": "Buy Now"})) == "click[Buy Now]"
    assert t.describe() == "call_api(name, params) with name one of search (params: query), click (params: target)"
    with pytest.raises(InvalidAction, match=r"no API 'buy' here; call one of search \(params: query\)"):
        t.translate(CallApi("buy", {}))
    with pytest.raises(InvalidAction, match="search takes params query; missing query; unknown q"):
        t.translate(CallApi("search", {"q": "shoes"}))
    with pytest.raises(InvalidAction, match="is 70 characters"):
        t.translate(CallApi("search", {"query": "x" * 62}))
    with pytest.raises(InvalidAction, match="does not apply here"):
        t.translate(PressKey("enter"))
    raw = CommandTranslator(space)  # no table: the command as JSON text for a Text space, else a dict
    assert json.loads(raw.translate(CallApi("search", {"q": "a"}))) == {"name": "search", "params": {"q": "a"}}
    assert CommandTranslator(None).translate(CallApi("go", {"n": 2})) == {"name": "go", "params": {"n": 2}}
    with pytest.raises(HarnessError, match="name every field"):
        CommandTranslator(space, table={"search": "search[{}]"})
    with pytest.raises(HarnessError, match="is not a template"):
        CommandTranslator(space, table={"search": "search[{query]"})


def test_auto_picks_by_space_and_bad_options_or_factories_say_why():
    assert auto_translator(spaces.Discrete(4), {}) == "keys"
    assert auto_translator(spaces.Text(5), {}) == "text"
    assert auto_translator(spaces.Text(5), {"table": {"a": "a"}}) == "commands"
    assert auto_translator(spaces.MultiDiscrete([3, 3]), {}) == "grid"
    with pytest.raises(HarnessError, match=r"no built-in universal-action translator fits .* 'module:function'"):
        auto_translator(spaces.Box(0, 1, (5,)), {})
    assert isinstance(build_translator("auto", spaces.Discrete(4), FL_NAMES), KeyTranslator)
    with pytest.raises(HarnessError, match="translator_kwargs has table, which the keys translator does not take "
                                           r"\(it takes: no options\)"):
        build_translator("auto", spaces.Discrete(4), None, {"table": {"a": "a"}})
    with pytest.raises(HarnessError, match=r"which the text translator does not take \(it takes: keys\)"):
        build_translator("text", spaces.Text(5), None, {"tabel": {}})
    custom = build_translator("m:f", spaces.Discrete(2), None, {"n": 2},
                              factory=lambda space, n: KeyTranslator(space, ["a", "b"][:n]))
    assert custom.translate(PressKey("b")) == 1
    with pytest.raises(HarnessError, match="returned a dict, which has no describe, example, translate"):
        build_translator("m:f", spaces.Discrete(2), factory=lambda space: {})
    with pytest.raises(HarnessError, match=r"agent\.translator m:f failed on the action space Discrete\(2\): KeyError"):
        build_translator("m:f", spaces.Discrete(2), factory=lambda space: {}["x"])
    # the config's list of translator names is the library's
    assert set(BUILTIN_TRANSLATORS) == {"auto", *BUILTIN}


def test_the_prompt_lists_the_translators_actions_and_both_answer_forms():
    t = KeyTranslator(spaces.Discrete(4), FL_NAMES)
    text = system_prompt("Reach G.", t, "universal")
    assert "Available actions: press_key(key) with key one of left, down, right, up." in text
    assert 'as a call such as press_key("left") or as JSON such as {"action": "press_key", "key": "left"}' in text
    hint = format_hint("universal", CommandTranslator(None, table={"search": "search[{query}]"}))
    assert 'call_api("search", {"query": "..."})' in hint


# ---- sessions -----------------------------------------------------------------------------------------

FROZENLAKE = """
harness: {type: gymnasium, id: FrozenLake-v1, kwargs: {map_name: 4x4, is_slippery: false}}
agent: {type: llm, max_steps: 12, random_map: true, action_format: universal, invalid_action_penalty: -0.1EXTRA}
tasks: {source: seeds, start: 0, count: 2}
eval_tasks: {source: seeds, start: 1000, count: 2}
policy: {type: grpo}
"""


def _cfg(tmp_path, text, extra=""):
    path = tmp_path / "run.yaml"
    path.write_text(text.replace("EXTRA", extra))
    return load_config(path)


def test_frozenlake_is_solved_through_press_key_in_both_forms(tmp_path):
    cfg = _cfg(tmp_path, FROZENLAKE)

    def answer(text, i):  # alternate the call form and the JSON form
        move = frozenlake_move(text)
        return f'I go {move}.\npress_key("{move}")' if i % 2 else json.dumps({"action": "press_key", "key": move})

    results, engine, tok = _run(cfg, answer, tmp_path)
    for r in results:
        assert r.status == SessionStatus.DONE, r.error
        v = r.verifier_output
        assert r.reward == 1.0 and v["success"] and v["invalid_actions"] == 0 and v["calls"] == v["steps"] >= 6
    prompt = tok.decode(engine.requests[0].prompt_ids)
    assert "Available actions: press_key(key) with key one of left, down, right, up." in prompt
    assert 'press_key("left") or as JSON such as {"action": "press_key", "key": "left"}' in prompt


def test_an_action_that_does_not_apply_is_repaired_and_then_counted_invalid(tmp_path):
    cfg = _cfg(tmp_path, FROZENLAKE)

    def answer(text, i):
        step = max(int(n) for n in re.findall(r"Step (\d+)\.", text))
        if step == 1 and "That is not a valid action" not in last_user_turn(text):
            return "click(1, 2)"  # repaired on the re-ask
        if step == 2:
            return "type('down')"  # in both tries: step 2 is an invalid action
        return f'press_key("{frozenlake_move(text)}")'

    results, engine, tok = _run(cfg, answer, tmp_path, tasks=load_run_tasks(cfg.tasks)[:1])
    r = results[0]
    assert r.status == SessionStatus.DONE, r.error
    v = r.verifier_output
    assert v["success"] and v["repaired"] == 1 and v["invalid_actions"] == 1
    assert v["invalid_reasons"][0].startswith('step 2: type("down") does not apply here; this env takes press_key(key)')
    assert r.reward == pytest.approx(1.0 - 0.1)
    turns = [last_user_turn(tok.decode(req.prompt_ids)) for req in engine.requests]
    assert any("That is not a valid action: click(1, 2) does not apply here" in t for t in turns)


class ShopEnv(gym.Env):
    """A WebShop-like text env: the action is a command string; search, then click Buy, earns 1."""

    observation_space = spaces.Text(200, charset=PRINTABLE)
    action_space = spaces.Text(100, charset=PRINTABLE)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.searched = False
        return "WebShop. Instruction: buy red shoes. [Search]", {}

    def step(self, action):
        if action == "search[red shoes]":
            self.searched = True
            return "Results: Red Shoes $20. [Buy]", 0.0, False, False, {}
        if action == "click[Buy]" and self.searched:
            return "Bought.", 1.0, True, False, {"is_success": True}
        return f"Unknown command {action}.", 0.0, False, False, {}


gym.register("polar-test/ShopEnv-v0", entry_point=ShopEnv)

SHOP = """
harness: {type: gymnasium, id: polar-test/ShopEnv-v0}
agent: {type: llm, max_steps: 4, action_format: universal, observation: textEXTRA}
tasks: {source: seeds, start: 0, count: 1}
policy: {type: grpo}
"""


def test_a_command_env_is_played_through_call_api_and_its_table(tmp_path):
    cfg = _cfg(tmp_path, SHOP, ", translator_kwargs: {table: {search: 'search[{query}]', click: 'click[{target}]'}}")

    def answer(text, i):
        if "[Buy]" in last_user_turn(text):
            return '{"action": "call_api", "name": "click", "params": {"target": "Buy"}}'
        return 'call_api("search", {"query": "red shoes"})'

    results, engine, tok = _run(cfg, answer, tmp_path)
    r = results[0]
    assert r.status == SessionStatus.DONE, r.error
    v = r.verifier_output
    assert v["success"] and v["steps"] == 2 and v["env_return"] == 1.0 and v["invalid_actions"] == 0
    assert "call_api(name, params) with name one of search (params: query), click (params: target)" in tok.decode(
        engine.requests[0].prompt_ids)


def test_bad_translator_keys_are_config_errors_that_say_how_to_fix_them(tmp_path):
    with pytest.raises(Exception, match=r"agent\.translator 'click' is not a translator: use one of auto, keys, "
                                        r"text, grid, commands, or 'module:function'"):
        _cfg(tmp_path, FROZENLAKE, ", translator: click")
    json_fmt = FROZENLAKE.replace("action_format: universal", "action_format: json")
    with pytest.raises(Exception, match=r"agent\.translator and agent\.translator_kwargs are for action_format universal"):
        _cfg(tmp_path, json_fmt, ", translator: keys")
    cfg = _cfg(tmp_path, FROZENLAKE, ", translator: grid")  # valid name, wrong space: refused at load
    with pytest.raises(Exception, match=r"FrozenLake-v1: translator grid needs a Box or MultiDiscrete"):
        session_runner(cfg)
    cfg = _cfg(tmp_path, FROZENLAKE, ", translator_kwargs: {keys: {enter: x}}")
    with pytest.raises(Exception, match=r"translator_kwargs has keys, which the keys translator does not take"):
        session_runner(cfg)
