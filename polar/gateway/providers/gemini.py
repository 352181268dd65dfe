"""Google Gemini: ``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent?alt=sse``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from polar.gateway.core import Call
from polar.gateway.errors import ApiError, bad
from polar.gateway.normalized import CallOutput, ChatRequest, Message
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
from polar.gateway.providers.schemas import lower_types, validate

NAME = "gemini"
FINISH = {"stop": "STOP", "stop_sequence": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "abort": "OTHER"}
STATUS_NAMES = {
    "invalid_request": "INVALID_ARGUMENT",
    "context_length": "INVALID_ARGUMENT",
    "authentication": "UNAUTHENTICATED",
    "permission": "PERMISSION_DENIED",
    "not_found": "NOT_FOUND",
    "method_not_allowed": "INVALID_ARGUMENT",
    "timeout": "DEADLINE_EXCEEDED",
    "too_large": "INVALID_ARGUMENT",
    "rate_limited": "RESOURCE_EXHAUSTED",
    "server_error": "INTERNAL",
    "unavailable": "UNAVAILABLE",
}
_IGNORED_PARTS = ("thought", "thoughtSignature")


def error_body(err: ApiError) -> dict[str, Any]:
    message = err.message
    if err.kind == "context_length" and err.context_length:
        message = (f"The input token count ({'at least ' if err.prompt_tokens_at_least else ''}{err.prompt_tokens}) exceeds the maximum number of tokens "
                   f"allowed ({err.context_length}).")
    return {"error": {"code": err.status, "message": message, "status": STATUS_NAMES[err.kind]}}


def _g(d: dict[str, Any], camel: str, snake: str) -> Any:
    return d.get(camel, d.get(snake))


def _text(parts: Any, where: str) -> str:
    check_type(parts, list, where)
    texts = []
    for i, p in enumerate(parts):
        check_type(p, dict, f"{where}[{i}]")
        if "text" not in p:
            raise bad(f"{where}[{i}] must be a text part", f"{where}[{i}]")
        texts.append(check_type(p["text"], str, f"{where}[{i}].text"))
    return "\n".join(texts)


def parse_contents(raw: Any, system: Any) -> list[Message]:
    out: list[Message] = []
    if system:
        check_type(system, dict, "systemInstruction")
        out.append({"role": "system", "content": _text(system.get("parts") or [], "systemInstruction.parts")})
    check_type(raw, list, "contents")
    if not raw:
        raise bad("'contents' must contain at least one item", "contents")
    n_calls = 0
    pending: list[str] = []  # ids of calls not answered yet, matched to functionResponse by order
    for i, c in enumerate(raw):
        where = f"contents[{i}]"
        check_type(c, dict, where)
        role = c.get("role", "user")
        if role not in ("user", "model", "function"):
            raise bad(f"{where}.role {role!r} is not supported; use 'user' or 'model'", f"{where}.role")
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        results: list[Message] = []
        for j, p in enumerate(require(c, "parts", list, f"{where}.")):
            pw = f"{where}.parts[{j}]"
            check_type(p, dict, pw)
            fc = _g(p, "functionCall", "function_call")
            fr = _g(p, "functionResponse", "function_response")
            if "text" in p and not p.get("thought"):
                texts.append(check_type(p["text"], str, f"{pw}.text"))
            elif fc is not None and role == "model":
                check_type(fc, dict, f"{pw}.functionCall")
                cid = fc.get("id") or f"call_g{n_calls}"
                n_calls += 1
                pending.append(cid)
                calls.append({"id": cid, "type": "function", "function": {
                    "name": require(fc, "name", str, f"{pw}.functionCall."), "arguments": fc.get("args") or {}}})
            elif fr is not None and role in ("user", "function"):
                check_type(fr, dict, f"{pw}.functionResponse")
                cid = fr.get("id") or (pending.pop(0) if pending else f"call_g{n_calls}")
                resp = fr.get("response")
                content = resp if isinstance(resp, str) else orjson.dumps(resp if resp is not None else {}).decode()
                results.append({"role": "tool", "tool_call_id": cid, "name": require(fr, "name", str, f"{pw}.functionResponse."),
                                "content": content})
            elif "text" in p or any(k in p for k in _IGNORED_PARTS):
                continue  # thoughts echoed back
            else:
                kinds = ", ".join(sorted(p)) or "empty"
                raise bad(f"{pw} ({kinds}) is not supported: this gateway serves a text-only model; use text, "
                          "functionCall or functionResponse parts", pw)
        if role == "model":
            msg: Message = {"role": "assistant", "content": "".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        else:
            out.extend(results)
            if texts or not results:
                out.append({"role": "user", "content": "\n".join(texts)})
    return out


def parse_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    check_type(tools, list, "tools")
    out = []
    for i, t in enumerate(tools):
        check_type(t, dict, f"tools[{i}]")
        decls = _g(t, "functionDeclarations", "function_declarations")
        if decls is None:
            note_ignored(NAME, [f"tools[].{k}" for k in t])  # built-in tools (googleSearch, codeExecution, ...)
            continue
        for j, d in enumerate(check_type(decls, list, f"tools[{i}].functionDeclarations")):
            check_type(d, dict, f"tools[{i}].functionDeclarations[{j}]")
            params = d.get("parametersJsonSchema") or d.get("parameters_json_schema") or d.get("parameters")
            out.append({"type": "function", "function": {
                "name": require(d, "name", str, f"tools[{i}].functionDeclarations[{j}]."),
                "description": d.get("description") or "",
                "parameters": lower_types(params) if params else {"type": "object", "properties": {}},
            }})
    return out


def _tool_choice(tool_config: object) -> str:
    if not isinstance(tool_config, dict):
        return "auto"
    fcc = _g(tool_config, "functionCallingConfig", "function_calling_config") or {}
    mode = str(fcc.get("mode", "AUTO")).upper()
    return {"NONE": "none", "ANY": "required"}.get(mode, "auto")


HANDLED = ("contents", "systemInstruction", "system_instruction", "tools", "toolConfig", "tool_config",
           "generationConfig", "generation_config")
GEN_HANDLED = ("candidateCount", "candidate_count", "maxOutputTokens", "max_output_tokens", "temperature", "topP",
               "top_p", "stopSequences", "stop_sequences", "seed")


def parse_request(body: dict[str, Any], request: Any) -> ChatRequest:
    target = request.path_params["target"]
    model, _, method = target.rpartition(":")
    if method not in ("generateContent", "streamGenerateContent") or not model:
        raise ApiError("not_found", f"unknown method {target!r}; use models/{{model}}:generateContent or "
                       ":streamGenerateContent")
    if method == "streamGenerateContent" and request.query_params.get("alt") != "sse":
        raise bad("streamGenerateContent is served as server-sent events only; add '?alt=sse' to the URL", "alt")
    v = validate(schemas.GeminiBody, body, request)  # types, ranges and tool schemas; 400 naming the field
    gen = _g(body, "generationConfig", "generation_config") or {}
    g = v.generationConfig or v.generation_config or schemas.GeminiGeneration()
    ignore_unhandled(NAME, body, HANDLED)
    ignore_unhandled(NAME, {f"generationConfig.{k}": v for k, v in gen.items()},
                     [f"generationConfig.{k}" for k in GEN_HANDLED])
    if (_g(gen, "candidateCount", "candidate_count") or 1) != 1:
        raise bad("'generationConfig.candidateCount' must be 1; send separate requests", "generationConfig.candidateCount")
    temperature, top_p = g.temperature, g.topP if g.topP is not None else g.top_p
    return ChatRequest(
        provider=NAME,
        model=model.removeprefix("models/"),
        messages=parse_contents(body["contents"], _g(body, "systemInstruction", "system_instruction")),
        tools=parse_tools(body.get("tools")),
        tool_choice=_tool_choice(_g(body, "toolConfig", "tool_config")),
        max_tokens=g.maxOutputTokens or g.max_output_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        stop=stop_list(_g(gen, "stopSequences", "stop_sequences"), "generationConfig.stopSequences"),
        seed=g.seed,
        stream=method == "streamGenerateContent",
    )


def _usage(out: CallOutput) -> dict[str, int]:
    return {"promptTokenCount": out.prompt_tokens, "candidatesTokenCount": out.completion_tokens,
            "totalTokenCount": out.prompt_tokens + out.completion_tokens}


def _call_parts(out: CallOutput) -> list[dict[str, Any]]:
    return [{"functionCall": {"id": c.id, "name": c.name,
                              "args": c.arguments if isinstance(c.arguments, dict) else {"_raw": c.arguments}}}
            for c in out.tool_calls]


def _chunk(req: ChatRequest, rid: str, parts: list[dict[str, Any]], out: CallOutput | None) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    body: dict[str, Any] = {"candidates": [cand], "modelVersion": req.model, "responseId": rid}
    if out is not None:
        cand["finishReason"] = FINISH[out.finish]
        body["usageMetadata"] = _usage(out)
    return body


def response(req: ChatRequest, call: Call, out: CallOutput) -> dict[str, Any]:
    parts = ([{"text": out.content}] if out.content or not out.tool_calls else []) + _call_parts(out)
    return _chunk(req, new_id(""), parts, out)


async def stream(req: ChatRequest, call: Call) -> AsyncIterator[bytes]:
    rid = new_id("")
    async for item in call.events():
        if isinstance(item, str):
            yield sse(orjson.dumps(_chunk(req, rid, [{"text": item}], None)))
            continue
        if item.finish == "abort":
            yield sse(orjson.dumps(error_body(ApiError("unavailable", "the inference engine aborted the request; retry"))))
            return
        yield sse(orjson.dumps(_chunk(req, rid, _call_parts(item) or [{"text": ""}], item)))
