"""A full tool-call round trip per provider, through each official SDK, streaming and not.

The tiny random model never writes a tool call by itself, so a ScriptedEngine (the real Engine
interface, real tokenizer, real tiny-model logprobs) emits the Hermes ``<tool_call>`` text. The gateway
must turn it into the provider's tool-call shape, render the tool result back through the chat
template, and build turn 2's prompt from turn 1's exact ids.
"""

from __future__ import annotations

import json

import pytest

CALL_TEXT = 'I will add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
ANSWER = "The sum is 3."
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}


def _openai_chat(url: str, stream: bool) -> tuple[str, dict, str]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/s/tc/v1", api_key="x", max_retries=0)
    tools = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": SCHEMA}}]
    msgs = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "What is 1 + 2?"}]
    if stream:
        chunks = list(client.chat.completions.create(model="tiny", messages=msgs, tools=tools, stream=True))
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        (tc,) = [t for c in chunks for t in (c.choices[0].delta.tool_calls or [])]
        finish = next(c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason)
        call_id, name, args = tc.id, tc.function.name, tc.function.arguments
    else:
        r = client.chat.completions.create(model="tiny", messages=msgs, tools=tools)
        content, finish = r.choices[0].message.content, r.choices[0].finish_reason
        (tc,) = r.choices[0].message.tool_calls
        call_id, name, args = tc.id, tc.function.name, tc.function.arguments
    assert finish == "tool_calls"
    msgs.append({"role": "assistant", "content": content, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]})
    msgs.append({"role": "tool", "tool_call_id": call_id, "content": "3"})
    final = client.chat.completions.create(model="tiny", messages=msgs, tools=tools)
    assert final.choices[0].finish_reason == "stop"
    return content, {"name": name, "args": json.loads(args)}, final.choices[0].message.content


def _openai_responses(url: str, stream: bool) -> tuple[str, dict, str]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/s/tc/v1", api_key="x", max_retries=0)
    tools = [{"type": "function", "name": "add", "description": "Add two integers.", "parameters": SCHEMA}]
    items: list = [{"role": "user", "content": "What is 1 + 2?"}]
    if stream:
        events = list(client.responses.create(model="tiny", instructions="Use tools.", input=items, tools=tools, stream=True))
        assert "response.function_call_arguments.done" in [e.type for e in events]
        output = events[-1].response.output
    else:
        output = client.responses.create(model="tiny", instructions="Use tools.", input=items, tools=tools).output
    msg = [o for o in output if o.type == "message"]
    (fc,) = [o for o in output if o.type == "function_call"]
    content = msg[0].content[0].text if msg else ""
    items += [{"role": "assistant", "content": content},
              {"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments},
              {"type": "function_call_output", "call_id": fc.call_id, "output": "3"}]
    final = client.responses.create(model="tiny", instructions="Use tools.", input=items, tools=tools)
    return content, {"name": fc.name, "args": json.loads(fc.arguments)}, final.output_text


def _anthropic(url: str, stream: bool) -> tuple[str, dict, str]:
    import anthropic

    client = anthropic.Anthropic(base_url=f"{url}/s/tc", api_key="x", max_retries=0)
    tools = [{"name": "add", "description": "Add two integers.", "input_schema": SCHEMA}]
    msgs: list = [{"role": "user", "content": "What is 1 + 2?"}]
    if stream:
        with client.messages.stream(model="tiny", max_tokens=200, system="Use tools.", messages=msgs, tools=tools) as s:
            msg = s.get_final_message()
    else:
        msg = client.messages.create(model="tiny", max_tokens=200, system="Use tools.", messages=msgs, tools=tools)
    assert msg.stop_reason == "tool_use"
    text = "".join(b.text for b in msg.content if b.type == "text")
    (tu,) = [b for b in msg.content if b.type == "tool_use"]
    msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
    msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id, "content": "3"}]})
    final = client.messages.create(model="tiny", max_tokens=200, system="Use tools.", messages=msgs, tools=tools)
    assert final.stop_reason == "end_turn"
    return text, {"name": tu.name, "args": tu.input}, final.content[0].text


def _gemini(url: str, stream: bool) -> tuple[str, dict, str]:
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=f"{url}/s/tc", api_version="v1beta"))
    decl = types.FunctionDeclaration(name="add", description="Add two integers.", parameters_json_schema=SCHEMA)
    cfg = types.GenerateContentConfig(system_instruction="Use tools.", tools=[types.Tool(function_declarations=[decl])],
                                      automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    contents = [types.Content(role="user", parts=[types.Part(text="What is 1 + 2?")])]
    if stream:
        chunks = list(client.models.generate_content_stream(model="tiny", contents=contents, config=cfg))
        parts = [p for c in chunks for p in c.candidates[0].content.parts]
    else:
        parts = client.models.generate_content(model="tiny", contents=contents, config=cfg).candidates[0].content.parts
    text = "".join(p.text or "" for p in parts)
    (fc,) = [p.function_call for p in parts if p.function_call]
    contents.append(types.Content(role="model", parts=[p for p in parts if p.function_call or p.text]))
    contents.append(types.Content(role="user", parts=[types.Part.from_function_response(name="add", response={"result": 3})]))
    final = client.models.generate_content(model="tiny", contents=contents, config=cfg)
    return text, {"name": fc.name, "args": fc.args}, final.text


CLIENTS = {"openai_chat": _openai_chat, "openai_responses": _openai_responses, "anthropic": _anthropic, "gemini": _gemini}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("provider", list(CLIENTS))
def test_tool_call_round_trip(provider, stream, gateway, scripted, tiny_tokenizer):
    engine = scripted([CALL_TEXT, ANSWER])
    gw = gateway(engine)
    content, call, answer = CLIENTS[provider](gw.url, stream)
    assert content == "I will add."
    assert call == {"name": "add", "args": {"a": 1, "b": 2}}
    assert answer == ANSWER

    rec1, rec2 = gw.records("tc")
    assert rec1.provider == provider and rec1.finish_reason == "tool_calls"
    assert rec1.metadata["output"]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 1, "b": 2}}
    first_prompt = tiny_tokenizer.decode(engine.requests[0].prompt_ids)
    assert '"name": "add"' in first_prompt and "Use tools." in first_prompt  # tools and system rendered
    # turn 2 = turn 1's exact prompt + sampled ids, then the tool result rendered by the template
    prefix = rec1.prompt_ids + rec1.sampled_ids
    assert engine.requests[1].prompt_ids[: len(prefix)] == prefix == rec2.prompt_ids[: len(prefix)]
    tail = tiny_tokenizer.decode(rec2.prompt_ids[len(prefix):])
    assert "<tool_response>" in tail and ("3" in tail) and tail.rstrip().endswith("<|im_start|>assistant")
    assert rec2.metadata["prompt_reuse"] == {"call_index": rec1.call_index, "reused_ids": len(prefix)}
    assert [m["role"] for m in rec2.messages][-2:] == ["assistant", "tool"]
