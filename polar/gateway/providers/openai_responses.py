"""OpenAI Responses: ``POST /v1/responses`` (request, response object, SSE events, errors).

Stateless only: ``previous_response_id`` / ``conversation`` (server-side state) are refused with a clear
400, so harnesses send the whole history as ``input`` (what ``store: false`` clients, e.g. Codex, do).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from polar.gateway.core import Call
from polar.gateway.errors import bad
from polar.gateway.normalized import CallOutput, ChatRequest, Message, parse_arguments, text_parts
from polar.gateway.providers import schemas
from polar.gateway.providers.common import (
    check_type,
    ignore_unhandled,
    new_id,
    note_ignored,
    now,
    require,
    sse,
)
from polar.gateway.providers.openai_chat import error_body  # same error shape as Chat Completions
from polar.gateway.providers.schemas import validate

NAME = "openai_responses"
__all__ = ["error_body", "parse_request", "response", "stream"]
ROLES = ("system", "developer", "user", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
_IGNORED_ITEMS = ("reasoning",)


def parse_input(raw: Any, instructions: Any) -> list[Message]:
    out: list[Message] = []
    if instructions:
        out.append({"role": "system", "content": text_parts(instructions, "instructions", TEXT_PARTS)})
    if isinstance(raw, str):
        out.append({"role": "user", "content": raw})
        return out
    check_type(raw, list, "input")
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        check_type(item, dict, where)
        kind = item.get("type", "message")
        if kind == "message":
            role = require(item, "role", str, f"{where}.")
            if role not in ROLES:
                raise bad(f"{where}.role {role!r} is not supported; use one of {', '.join(ROLES)}", f"{where}.role")
            content = text_parts(item.get("content"), f"{where}.content", TEXT_PARTS)
            out.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind == "function_call":
            call = {"id": require(item, "call_id", str, f"{where}."), "type": "function", "function": {
                "name": require(item, "name", str, f"{where}."), "arguments": parse_arguments(item.get("arguments"))}}
            prev = out[-1] if out else None
            if prev is not None and prev["role"] == "assistant":
                prev.setdefault("tool_calls", []).append(call)  # one assistant turn: text + its calls
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else text_parts(output, f"{where}.output", TEXT_PARTS)
            out.append({"role": "tool", "tool_call_id": require(item, "call_id", str, f"{where}."), "content": text})
        elif kind in _IGNORED_ITEMS:
            continue
        else:
            raise bad(f"{where}.type {kind!r} is not supported; use message, function_call or function_call_output",
                      f"{where}.type")
    if not any(m["role"] != "system" for m in out):
        raise bad("'input' must contain at least one message", "input")
    return out


def parse_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    check_type(tools, list, "tools")
    out = []
    for i, t in enumerate(tools):
        check_type(t, dict, f"tools[{i}]")
        kind = t.get("type")
        if kind == "namespace":  # a group of function tools (Codex): offer its functions
            out.extend(parse_tools(t.get("tools") or []))
            continue
        if kind != "function":
            note_ignored(NAME, [f"tools[].type={kind}"])  # hosted tools (web_search, ...) cannot run here
            continue
        out.append({"type": "function", "function": {
            "name": require(t, "name", str, f"tools[{i}]."),
            "description": t.get("description") or "",
            "parameters": t.get("parameters") or {"type": "object", "properties": {}},
        }})
    return out


def _tool_choice(v: Any) -> str:
    if v is None:
        return "auto"
    if v in ("auto", "none", "required"):
        return v
    if isinstance(v, dict) and v.get("type") == "function" and isinstance(v.get("name"), str):
        return v["name"]
    raise bad("'tool_choice' must be auto, none, required or {'type': 'function', 'name': ...}", "tool_choice")


HANDLED = ("model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "temperature", "top_p",
           "stream", "previous_response_id", "conversation")


def parse_request(body: dict[str, Any], request: Any) -> ChatRequest:
    for key in ("previous_response_id", "conversation"):
        if body.get(key):
            raise bad(f"'{key}' (server-side conversation state) is not supported by this gateway; "
                      "send the full history in 'input'", key)
    v = validate(schemas.ResponsesBody, body, request)  # types, ranges and tool schemas; 400 naming the field
    ignore_unhandled(NAME, body, HANDLED)
    return ChatRequest(
        provider=NAME,
        model=v.model,
        messages=parse_input(body["input"], body.get("instructions")),
        tools=parse_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice")),
        max_tokens=v.max_output_tokens,
        temperature=1.0 if v.temperature is None else v.temperature,
        top_p=1.0 if v.top_p is None else v.top_p,
        stream=bool(v.stream),
    )


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []}


def _call_items(out: CallOutput) -> list[dict[str, Any]]:
    return [{"type": "function_call", "id": "fc_" + c.id.removeprefix("call_"), "call_id": c.id, "name": c.name,
             "arguments": c.arguments_json, "status": "completed"} for c in out.tool_calls]


def _response_obj(req: ChatRequest, rid: str, created: int, status: str, output: list[dict[str, Any]],
                  out: CallOutput | None) -> dict[str, Any]:
    incomplete = out is not None and out.finish == "length"
    return {
        "id": rid, "object": "response", "created_at": created, "model": req.model,
        "status": "incomplete" if incomplete else status,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None, "output": output, "parallel_tool_calls": True,
        "tool_choice": req.tool_choice if req.tool_choice in ("auto", "none", "required") else {"type": "function", "name": req.tool_choice},
        "tools": [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                   "parameters": t["function"]["parameters"], "strict": False} for t in req.tools],
        "temperature": req.temperature, "top_p": req.top_p, "max_output_tokens": req.max_tokens,
        "text": {"format": {"type": "text"}}, "metadata": {},
        "usage": None if out is None else {
            "input_tokens": out.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": out.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": out.prompt_tokens + out.completion_tokens},
    }


def response(req: ChatRequest, call: Call, out: CallOutput) -> dict[str, Any]:
    output = []
    if out.content or not out.tool_calls:
        output.append(_message_item(new_id("msg_"), out.content))
    output.extend(_call_items(out))
    return _response_obj(req, new_id("resp_"), now(), "completed", output, out)


async def stream(req: ChatRequest, call: Call) -> AsyncIterator[bytes]:
    rid, created, seq = new_id("resp_"), now(), 0

    def ev(kind: str, data: dict[str, Any]) -> bytes:
        nonlocal seq
        seq += 1
        return sse(orjson.dumps({"type": kind, "sequence_number": seq - 1, **data}), kind)

    yield ev("response.created", {"response": _response_obj(req, rid, created, "in_progress", [], None)})
    yield ev("response.in_progress", {"response": _response_obj(req, rid, created, "in_progress", [], None)})
    msg_id = new_id("msg_")
    text_open = False
    output: list[dict[str, Any]] = []
    async for item in call.events():
        if isinstance(item, str):
            if not text_open:
                text_open = True
                yield ev("response.output_item.added", {"output_index": 0, "item": _message_item(msg_id, "", "in_progress")})
                yield ev("response.content_part.added", {"item_id": msg_id, "output_index": 0, "content_index": 0,
                                                         "part": {"type": "output_text", "text": "", "annotations": []}})
            yield ev("response.output_text.delta", {"item_id": msg_id, "output_index": 0, "content_index": 0,
                                                    "delta": item, "logprobs": []})
            continue
        out = item
        if out.finish == "abort":
            yield ev("error", {"code": "server_error", "message": "the inference engine aborted the request; retry", "param": None})
            return
        if not text_open and not out.tool_calls:
            text_open = True
            yield ev("response.output_item.added", {"output_index": 0, "item": _message_item(msg_id, "", "in_progress")})
            yield ev("response.content_part.added", {"item_id": msg_id, "output_index": 0, "content_index": 0,
                                                     "part": {"type": "output_text", "text": "", "annotations": []}})
        if text_open:
            done = _message_item(msg_id, out.content)
            yield ev("response.output_text.done", {"item_id": msg_id, "output_index": 0, "content_index": 0,
                                                   "text": out.content, "logprobs": []})
            yield ev("response.content_part.done", {"item_id": msg_id, "output_index": 0, "content_index": 0,
                                                    "part": done["content"][0]})
            yield ev("response.output_item.done", {"output_index": 0, "item": done})
            output.append(done)
        for fc in _call_items(out):
            idx = len(output)
            yield ev("response.output_item.added", {"output_index": idx, "item": {**fc, "arguments": "", "status": "in_progress"}})
            yield ev("response.function_call_arguments.delta", {"item_id": fc["id"], "output_index": idx, "delta": fc["arguments"]})
            yield ev("response.function_call_arguments.done", {"item_id": fc["id"], "output_index": idx, "arguments": fc["arguments"]})
            yield ev("response.output_item.done", {"output_index": idx, "item": fc})
            output.append(fc)
        final = _response_obj(req, rid, created, "completed", output, out)
        yield ev("response.incomplete" if final["status"] == "incomplete" else "response.completed", {"response": final})
