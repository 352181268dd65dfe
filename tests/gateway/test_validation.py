"""Request bodies are validated (pydantic models per provider): bad tool schemas, misplaced roles, wrongly
typed sampling values and out-of-range seeds get that provider's 400 naming the field; error codes say
what was not found; admin parameters are checked, never silently defaulted."""

from __future__ import annotations

import httpx
import pytest

BANANA = {"type": "banana"}
OK_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture
def gw(gateway, scripted):
    return gateway(scripted(lambda req, i: "ok"), admin_token="adm")


def _oa(gw, **kw):
    import openai

    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0, **kw)


def _ant(gw, **kw):
    import anthropic

    return anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0, **kw)


def _gem(gw):
    from google import genai
    from google.genai import types

    return genai.Client(api_key="k", http_options=types.HttpOptions(base_url=gw.url, api_version="v1beta"))


def test_openai_chat_and_responses_reject_invalid_tool_schemas(gw):
    import openai

    client = _oa(gw)
    msgs = [{"role": "user", "content": "weather?"}]
    for params, needle in (("nope", "valid dictionary"), (BANANA, "type 'object'"), ({"type": "array"}, "type 'object'"),
                           ({"type": "object", "properties": {"x": {"type": "banana"}}}, "not a valid JSON schema")):
        tool = {"type": "function", "function": {"name": "weather", "parameters": params}}
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=msgs, tools=[tool])
        assert e.value.status_code == 400 and e.value.param == "tools[0].function.parameters", e.value.body
        assert needle in e.value.message and "tools[0].function.parameters" in e.value.message
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="tiny", input="weather?", tools=[{"type": "function", "name": "weather", "parameters": params}])
        assert e.value.param == "tools[0].parameters" and needle in e.value.message, e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=msgs, tools=[{"type": "function"}])
    assert e.value.param == "tools[0]" and "needs 'function'" in e.value.message
    # valid schemas (and a function without parameters) still work
    ok = [{"type": "function", "function": {"name": "weather", "parameters": OK_SCHEMA}},
          {"type": "function", "function": {"name": "now"}}]
    assert client.chat.completions.create(model="tiny", messages=msgs, tools=ok).choices[0].message.content == "ok"
    assert client.responses.create(model="tiny", input="x", tools=[{"type": "function", "name": "w", "parameters": OK_SCHEMA}]).output_text == "ok"


def test_anthropic_rejects_tools_without_a_valid_input_schema_and_system_turns(gw):
    import anthropic

    client = _ant(gw)
    msgs = [{"role": "user", "content": "weather?"}]
    for tool, needle in (({"name": "weather"}, "needs 'input_schema'"), ({"name": "weather", "input_schema": "nope"}, "valid dictionary"),
                         ({"name": "weather", "input_schema": BANANA}, "type 'object'")):
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model="tiny", max_tokens=4, messages=msgs, tools=[tool])
        assert e.value.status_code == 400 and e.value.body["error"]["type"] == "invalid_request_error"
        assert "'tools[0]" in e.value.body["error"]["message"] and needle in e.value.body["error"]["message"], e.value.body
    system_turn = [{"role": "user", "content": "hi"}, {"role": "system", "content": "be brief"}]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny", max_tokens=4, messages=system_turn)
    message = e.value.body["error"]["message"]
    assert "'messages[1].role'" in message and "top-level 'system'" in message, message
    # the beta feature Claude Code enables makes system turns legal, as on Anthropic's API
    r = client.messages.create(model="tiny", max_tokens=4, messages=system_turn,
                               extra_headers={"anthropic-beta": "mid-conversation-system-2026-04-07"})
    assert r.content[0].text == "ok"
    assert client.messages.create(model="tiny", max_tokens=4, messages=msgs,
                                  tools=[{"name": "weather", "input_schema": OK_SCHEMA}]).content[0].text == "ok"
    # count_tokens validates the same way
    r = httpx.post(f"{gw.url}/v1/messages/count_tokens", json={"model": "tiny", "messages": msgs, "tools": [{"name": "w"}]}, timeout=60)
    assert r.status_code == 400 and "input_schema" in r.json()["error"]["message"]


def test_gemini_rejects_invalid_function_declarations(gw):
    from google.genai import errors, types

    client = _gem(gw)
    bad_decl = types.FunctionDeclaration(name="weather", parameters_json_schema=BANANA)
    with pytest.raises(errors.ClientError) as e:
        client.models.generate_content(model="tiny", contents="weather?",
                                       config=types.GenerateContentConfig(tools=[types.Tool(function_declarations=[bad_decl])]))
    # (the SDK spells it parameters_json_schema; the message names the field as sent)
    assert e.value.code == 400 and "'tools[0].functionDeclarations[0].parameters_json_schema' must be a JSON schema of type 'object'" in e.value.message
    url = f"{gw.url}/v1beta/models/tiny:generateContent"
    contents = [{"role": "user", "parts": [{"text": "weather?"}]}]
    for decl, where in (({"name": "weather", "parameters": "nope"}, "parameters"),
                        ({"name": "weather", "parameters": {"type": "BANANA"}}, "parameters"),
                        ({"parameters": OK_SCHEMA}, "name")):
        r = httpx.post(url, json={"contents": contents, "tools": [{"functionDeclarations": [decl]}]}, timeout=60)
        err = r.json()["error"]
        assert r.status_code == 400 and err["status"] == "INVALID_ARGUMENT" and err["code"] == 400
        assert f"tools[0].functionDeclarations[0].{where}" in err["message"], err
    # Gemini's capitalized OpenAPI types are valid
    good = types.FunctionDeclaration(name="weather", parameters=types.Schema(
        type=types.Type.OBJECT, properties={"city": types.Schema(type=types.Type.STRING)}))
    r = client.models.generate_content(model="tiny", contents="weather?",
                                       config=types.GenerateContentConfig(tools=[types.Tool(function_declarations=[good])]))
    assert r.text == "ok"


@pytest.mark.parametrize(("body", "param", "needle"), [
    ({"temperature": "1"}, "temperature", "valid number"),
    ({"temperature": True}, "temperature", "valid number"),
    ({"top_p": 0}, "top_p", "> 0"),
    ({"max_tokens": 1.5}, "max_tokens", "valid integer"),
    ({"stream": 1}, "stream", "valid boolean"),
    ({"stop": [1]}, "stop[0]", "valid string"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "valid string or a valid list"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": 3}]}, "messages[0].tool_call_id", "valid string"),
])
def test_openai_sampling_and_message_types_are_strict(gw, body, param, needle):
    base = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{gw.url}/v1/chat/completions", json={**base, **body}, timeout=60)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param and needle in err["message"], err
    assert err["message"].startswith(f"'{param}'")


def test_seeds_beyond_the_engines_range_are_reported_as_the_integer_sent(gw):
    for seed in (2**70, 2**63, -(2**63) - 1):
        raw = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "seed": %d}' % seed
        r = httpx.post(f"{gw.url}/v1/chat/completions", content=raw, headers={"content-type": "application/json"}, timeout=60)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "seed", err
        assert f"(got {seed})" in err["message"] and "e+" not in err["message"], err["message"]
    r = httpx.post(f"{gw.url}/v1beta/models/tiny:generateContent", timeout=60,
                   json={"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"seed": 2**40}})
    assert r.status_code == 400 and f"(got {2**40})" in r.json()["error"]["message"]
    ok = _oa(gw).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], seed=2**63 - 1)
    assert ok.choices[0].message.content == "ok"
    assert gw.records("k")[-1].metadata["sampling"]["seed"] == 2**63 - 1


def test_errors_carry_the_right_code_and_status(gw):
    import openai

    r = httpx.get(f"{gw.url}/sessions/nobody", headers={"x-polar-admin-token": "adm"}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found" and "nobody" in r.json()["error"]["message"]
    r = httpx.get(f"{gw.url}/v1/chat/completions", timeout=60)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed" and "POST" in r.json()["error"]["message"]
    r = httpx.post(f"{gw.url}/v1/nowhere", json={}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    with pytest.raises(openai.NotFoundError) as e:
        _oa(gw).models.retrieve("gpt-99")
    assert e.value.code == "model_not_found"


def test_admin_timeouts_must_be_seconds(gw):
    admin = {"x-polar-admin-token": "adm"}
    for value in ("abc", "-1", "inf", "nan"):
        r = httpx.post(f"{gw.url}/admin/pause", params={"timeout_s": value}, headers=admin, timeout=60)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "timeout_s" and repr(value) in err["message"], (value, err)
    assert httpx.get(f"{gw.url}/health", timeout=60).json()["paused"] is False  # refused, so nothing paused
    r = httpx.post(f"{gw.url}/admin/weights", json={"path": "w.safetensors", "policy_version": 1, "timeout_s": "abc"},
                   headers=admin, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "timeout_s"
    r = httpx.post(f"{gw.url}/admin/weights", json={"path": "w.safetensors", "policy_version": "1"}, headers=admin, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "policy_version"
    assert httpx.post(f"{gw.url}/admin/pause", params={"timeout_s": "0"}, headers=admin, timeout=60).json()["paused"] is True
