"""OpenAI Chat Completions: ``POST /v1/chat/completions`` (request, response, SSE chunks, errors)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from polar.gateway.core import Call
from polar.gateway.errors import ApiError, bad
from polar.gateway.normalized import CallOutput, ChatRequest, Message, parse_arguments, text_parts
from polar.gateway.providers import schemas
from polar.gateway.providers.common import (
    ignore_unhandled,
    new_id,
    note_ignored,
    now,
    require,
    sse,
    stop_list,
)
from polar.gateway.providers.schemas import validate

NAME = "openai_chat"
PART_TYPES = ("text", "input_text", "output_text", "refusal")  # content parts read as text
FINISH = {"stop": "stop", "stop_sequence": "stop", "length": "length", "tool_calls": "tool_calls", "abort": "stop"}
ERROR_TYPES = {
    "invalid_request": ("invalid_request_error", None),
    "context_length": ("invalid_request_error", "context_length_exceeded"),
    "authentication": ("invalid_request_error", "invalid_api_key"),
    "permission": ("invalid_request_error", "permission_denied"),
    "not_found": ("invalid_request_error", "not_found"),
    "method_not_allowed": ("invalid_request_error", "method_not_allowed"),
    "timeout": ("invalid_request_error", "request_timeout"),
    "too_large": ("invalid_request_error", "request_too_large"),
    "rate_limited": ("rate_limit_error", "rate_limit_exceeded"),
    "server_error": ("server_error", None),
    "unavailable": ("server_error", "service_unavailable"),
}


def error_body(err: ApiError) -> dict[str, Any]:
    etype, code = ERROR_TYPES[err.kind]
    code = err.code or code
    message = err.message
    if err.kind == "context_length" and err.context_length:
        message = (
            f"This model's maximum context length is {err.context_length} tokens. However, your messages "
            f"resulted in {'at least ' if err.prompt_tokens_at_least else ''}{err.prompt_tokens} tokens. Please reduce the length of the messages."
        )
    return {"error": {"message": message, "type": etype, "param": err.param, "code": code}}


def parse_tools(tools: Any) -> list[dict[str, Any]]:
    """``tools`` of a body ``schemas.ChatBody`` accepted: a list of maps, each function tool with a named function."""
    if tools is None:
        return []
    out = []
    for t in tools:
        if t.get("type", "function") != "function":
            note_ignored(NAME, [f"tools[].type={t.get('type')}"])  # e.g. custom/hosted tools: not callable here
            continue
        fn = t["function"]
        out.append({"type": "function", "function": {
            "name": fn["name"],
            "description": fn.get("description") or "",
            "parameters": fn.get("parameters") or {"type": "object", "properties": {}},
        }})
    return out


def tool_choice(v: Any, name: str = "tool_choice") -> str:
    if v is None:
        return "auto"
    if isinstance(v, str) and v in ("auto", "none", "required"):
        return v
    if isinstance(v, dict) and isinstance(v.get("function"), dict) and isinstance(v["function"].get("name"), str):
        return v["function"]["name"]
    raise bad(f"'{name}' must be 'auto', 'none', 'required' or {{'type': 'function', 'function': {{'name': ...}}}}", name)


def parse_messages(raw: list[dict[str, Any]]) -> list[Message]:
    """The messages of a body ``schemas.ChatBody`` accepted: roles, content and tool-call shapes are checked
    there, so this one walk only reads them (and checks what the schema leaves open: content parts, a tool
    message's ``tool_call_id``)."""
    out: list[Message] = []
    for i, m in enumerate(raw):
        role = m["role"]
        content = m.get("content")
        if not isinstance(content, str):
            content = text_parts(content, f"messages[{i}].content", PART_TYPES)
        if role == "developer":
            role = "system"
        msg: Message = {"role": role, "content": content}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [{
                "id": c.get("id") or f"call_{i}_{j}",
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": parse_arguments(c["function"].get("arguments"))},
            } for j, c in enumerate(m["tool_calls"])]
        if role == "tool":
            msg["tool_call_id"] = require(m, "tool_call_id", str, f"messages[{i}].")
            if m.get("name"):
                msg["name"] = m["name"]
        out.append(msg)
    return out


HANDLED = ("model", "messages", "n", "stream", "stream_options", "tools", "tool_choice", "max_tokens",
           "max_completion_tokens", "temperature", "top_p", "stop", "seed", "logprobs", "top_logprobs")
MAX_TOP_LOGPROBS = 20  # OpenAI's limit


def top_logprobs(body: dict[str, Any]) -> int:
    """``top_logprobs`` (0-20), which OpenAI accepts only together with ``logprobs: true``."""
    n = body.get("top_logprobs")
    if n is None:
        return 0
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_TOP_LOGPROBS:
        raise bad(f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS} (got {n!r})", "top_logprobs")
    if n and body.get("logprobs") is not True:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return n


def parse(body: dict[str, Any], request: Any = None) -> ChatRequest:
    v = validate(schemas.ChatBody, body, request)  # types, ranges and tool schemas; 400 naming the field
    ignore_unhandled(NAME, body, HANDLED)
    if v.n not in (None, 1):
        raise bad("'n' must be 1: the gateway records one sample per call; send separate requests", "n")
    stream_options = v.stream_options or {}
    return ChatRequest(
        provider=NAME,
        top_logprobs=top_logprobs(body),
        model=v.model,
        messages=parse_messages(body["messages"]),
        tools=parse_tools(body.get("tools")),
        tool_choice=tool_choice(body.get("tool_choice")),
        max_tokens=v.max_completion_tokens or v.max_tokens,
        temperature=1.0 if v.temperature is None else v.temperature,
        top_p=1.0 if v.top_p is None else v.top_p,
        stop=stop_list(v.stop, "stop"),
        seed=v.seed,
        stream=bool(v.stream),
        logprobs=bool(v.logprobs),
        include_usage=bool(stream_options.get("include_usage")),
    )


def _tool_calls(out: CallOutput) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
        for c in out.tool_calls
    ]


def _usage(out: CallOutput) -> dict[str, int]:
    return {
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "total_tokens": out.prompt_tokens + out.completion_tokens,
    }


def _logprobs(call: Call, out: CallOutput) -> dict[str, Any]:
    """OpenAI's shape: each token's text and UTF-8 bytes (not the tokenizer's piece spelling), with the
    requested number of most likely alternatives."""
    if out.logprob_content is not None:  # a text-level engine: the endpoint's own entries, passed through
        return {"content": out.logprob_content}
    tb = call.core.token_bytes
    tops = out.top_logprobs or [[] for _ in out.sampled_ids]
    return {"content": [
        {**tb.entry(t, lp), "top_logprobs": [tb.entry(a, alp) for a, alp in top]}
        for t, lp, top in zip(out.sampled_ids, out.logprobs, tops, strict=False)
    ]}


def response(req: ChatRequest, call: Call, out: CallOutput) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": out.content if (out.content or not out.tool_calls) else None}
    if out.tool_calls:
        msg["tool_calls"] = _tool_calls(out)
    return {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": now(),
        "model": req.model,
        "choices": [{
            "index": 0,
            "message": msg,
            "logprobs": _logprobs(call, out) if req.logprobs else None,
            "finish_reason": FINISH[out.finish],
        }],
        "usage": _usage(out),
    }


async def stream(req: ChatRequest, call: Call) -> AsyncIterator[bytes]:
    cid, created = new_id("chatcmpl-"), now()

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse(orjson.dumps({
            "id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }))

    yield chunk({"role": "assistant", "content": ""})
    async for ev in call.events():
        if isinstance(ev, str):
            yield chunk({"content": ev})
            continue
        if ev.finish == "abort":
            yield sse(orjson.dumps(error_body(ApiError("unavailable", "the inference engine aborted the request; retry"))))
            return
        if ev.tool_calls:
            yield chunk({"tool_calls": [{"index": i, **tc} for i, tc in enumerate(_tool_calls(ev))]})
        yield chunk({}, FINISH[ev.finish])
        if req.include_usage:
            yield sse(orjson.dumps({
                "id": cid, "object": "chat.completion.chunk", "created": created, "model": req.model,
                "choices": [], "usage": _usage(ev),
            }))
    yield b"data: [DONE]\n\n"


def parse_request(body: dict[str, Any], request: Any) -> ChatRequest:
    return parse(body, request)
