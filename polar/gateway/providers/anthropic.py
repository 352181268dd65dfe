"""Anthropic Messages: ``POST /v1/messages`` (request, response, SSE events, errors)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from polar.gateway.core import Call
from polar.gateway.errors import ApiError, bad
from polar.gateway.normalized import CallOutput, ChatRequest, Message, text_parts
from polar.gateway.providers import schemas
from polar.gateway.providers.common import (
    check_type,
    ignore_unhandled,
    new_id,
    note_ignored,
    require,
    sse,
    stop_list,
)
from polar.gateway.providers.schemas import validate

NAME = "anthropic"
STOP = {"stop": "end_turn", "stop_sequence": "stop_sequence", "length": "max_tokens", "tool_calls": "tool_use", "abort": "end_turn"}
ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "context_length": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "method_not_allowed": "invalid_request_error",
    "timeout": "invalid_request_error",
    "too_large": "request_too_large",
    "rate_limited": "rate_limit_error",
    "server_error": "api_error",
    "unavailable": "overloaded_error",
}
_IGNORED_BLOCKS = ("thinking", "redacted_thinking")


def error_body(err: ApiError) -> dict[str, Any]:
    message = err.message
    if err.kind == "context_length" and err.context_length:
        message = f"prompt is too long: {'at least ' if err.prompt_tokens_at_least else ''}{err.prompt_tokens} tokens > {err.context_length} maximum"
    return {"type": "error", "error": {"type": ERROR_TYPES[err.kind], "message": message}}


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    check_type(content, list, where)
    out = []
    for i, b in enumerate(content):
        check_type(b, dict, f"{where}[{i}]")
        require(b, "type", str, f"{where}[{i}].")
        out.append(b)
    return out


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    text = text_parts(block.get("content"), f"{where}.content", ("text",))
    return f"Error: {text}" if block.get("is_error") else text


def parse_messages(raw: Any, system: Any) -> list[Message]:
    out: list[Message] = []
    if system:
        out.append({"role": "system", "content": text_parts(system, "system", ("text",))})
    check_type(raw, list, "messages")
    if not raw:
        raise bad("'messages' must contain at least one message", "messages")
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        check_type(m, dict, where)
        role = require(m, "role", str, f"{where}.")
        if role == "system":  # anthropic-beta mid-conversation-system (Claude Code); validated by schemas
            out.append({"role": "system", "content": text_parts(m.get("content"), f"{where}.content", ("text",))})
            continue
        if role not in ("user", "assistant"):
            raise bad(f"{where}.role {role!r} is not supported; Anthropic messages are 'user' or 'assistant' "
                      "(put system text in the top-level 'system')", f"{where}.role")
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        results: list[Message] = []
        for j, b in enumerate(_blocks(require(m, "content", (str, list), f"{where}."), f"{where}.content")):
            bw = f"{where}.content[{j}]"
            kind = b["type"]
            if kind == "text":
                texts.append(require(b, "text", str, f"{bw}."))
            elif kind == "tool_use" and role == "assistant":
                calls.append({"id": require(b, "id", str, f"{bw}."), "type": "function", "function": {
                    "name": require(b, "name", str, f"{bw}."), "arguments": check_type(b.get("input") or {}, dict, f"{bw}.input")}})
            elif kind == "tool_result" and role == "user":
                results.append({"role": "tool", "tool_call_id": require(b, "tool_use_id", str, f"{bw}."),
                                "content": _tool_result_text(b, bw)})
            elif kind in _IGNORED_BLOCKS:
                continue  # reasoning the client echoes back; this gateway's models do not emit it
            else:
                raise bad(f"{bw}.type {kind!r} is not supported in a {role} message; use text"
                          + (", tool_use" if role == "assistant" else ", tool_result"), f"{bw}.type")
        if role == "assistant":
            msg: Message = {"role": "assistant", "content": "".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        else:
            out.extend(results)  # tool results first: they answer the previous assistant turn
            if texts or not results:
                out.append({"role": "user", "content": "\n".join(texts)})
    return out


def parse_tools(tools: Any) -> list[dict[str, Any]]:
    """``tools`` of a body ``schemas.AnthropicBody`` accepted: a list of maps, each client tool named, with a schema."""
    if tools is None:
        return []
    out = []
    for t in tools:
        if t.get("type") not in (None, "custom"):
            note_ignored(NAME, [f"tools[].type={t.get('type')}"])  # server tools cannot run here
            continue
        out.append({"type": "function", "function": {
            "name": t["name"],
            "description": t.get("description") or "",
            "parameters": t["input_schema"] or {"type": "object", "properties": {}},  # validated by schemas
        }})
    return out


def _tool_choice(v: Any) -> str:
    if v is None:
        return "auto"
    check_type(v, dict, "tool_choice")
    kind = v.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(v.get("name"), str):
        return v["name"]
    raise bad("'tool_choice.type' must be auto, any, tool (with name) or none", "tool_choice")


HANDLED = ("model", "messages", "system", "tools", "tool_choice", "max_tokens", "temperature", "top_p",
           "stop_sequences", "stream")


def _mid_conversation_system(request: Any) -> bool:
    """Whether the client enabled system turns inside ``messages`` (``anthropic-beta`` header)."""
    headers = getattr(request, "headers", None) or {}
    return schemas.MID_CONVERSATION_SYSTEM_BETA in (headers.get("anthropic-beta") or "")


def parse_request(body: dict[str, Any], request: Any, count_only: bool = False) -> ChatRequest:
    v = validate(schemas.AnthropicBody, body, request, mid_conversation_system=_mid_conversation_system(request))
    ignore_unhandled(NAME, body, HANDLED)
    if v.max_tokens is None and not count_only:
        raise bad("missing required field 'max_tokens'", "max_tokens")
    return ChatRequest(
        provider=NAME,
        model=v.model,
        messages=parse_messages(body["messages"], body.get("system")),
        tools=parse_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice")),
        max_tokens=v.max_tokens,
        temperature=1.0 if v.temperature is None else v.temperature,
        top_p=1.0 if v.top_p is None else v.top_p,
        stop=stop_list(v.stop_sequences, "stop_sequences"),
        stream=bool(v.stream),
    )


def _content(out: CallOutput) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if out.content or not out.tool_calls:
        blocks.append({"type": "text", "text": out.content})
    for c in out.tool_calls:
        blocks.append({"type": "tool_use", "id": "toolu_" + c.id.removeprefix("call_"), "name": c.name,
                       "input": c.arguments if isinstance(c.arguments, dict) else {"_raw": c.arguments}})
    return blocks


def _usage(out: CallOutput) -> dict[str, int]:
    return {"input_tokens": out.prompt_tokens, "output_tokens": out.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def response(req: ChatRequest, call: Call, out: CallOutput) -> dict[str, Any]:
    return {
        "id": new_id("msg_"), "type": "message", "role": "assistant", "model": req.model,
        "content": _content(out), "stop_reason": STOP[out.finish], "stop_sequence": out.stop_sequence,
        "usage": _usage(out),
    }


async def stream(req: ChatRequest, call: Call) -> AsyncIterator[bytes]:
    def ev(kind: str, data: dict[str, Any]) -> bytes:
        return sse(orjson.dumps({"type": kind, **data}), kind)

    prompt_tokens = len(call.prompt.ids) if call.prompt else 0
    yield ev("message_start", {"message": {
        "id": new_id("msg_"), "type": "message", "role": "assistant", "model": req.model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}})
    text_open = False
    index = 0
    async for item in call.events():
        if isinstance(item, str):
            if not text_open:
                yield ev("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
                text_open = True
            yield ev("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": item}})
            continue
        out = item
        if out.finish == "abort":
            yield ev("error", {"error": {"type": "overloaded_error", "message": "the inference engine aborted the request; retry"}})
            return
        if not text_open and not out.tool_calls:
            yield ev("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
            text_open = True
        if text_open:
            yield ev("content_block_stop", {"index": index})
            index += 1
        for block in _content(out)[1 if (out.content or not out.tool_calls) else 0 :]:
            yield ev("content_block_start", {"index": index, "content_block": {**block, "input": {}}})
            yield ev("content_block_delta", {"index": index, "delta": {
                "type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}})
            yield ev("content_block_stop", {"index": index})
            index += 1
        yield ev("message_delta", {"delta": {"stop_reason": STOP[out.finish], "stop_sequence": out.stop_sequence},
                                   "usage": {"output_tokens": out.completion_tokens}})
        yield ev("message_stop", {})
