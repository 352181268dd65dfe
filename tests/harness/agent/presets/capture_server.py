"""A recording stand-in for a model API: logs every request a coding CLI sends, answers minimally.

Used to capture the fixtures under ``tests/harness/agent/presets/fixtures/`` (``python -m tests.harness.agent.presets.capture_cli``).
Each reply follows the provider's documented wire format (Anthropic Messages SSE, OpenAI Responses
SSE, OpenAI Chat SSE, Gemini ``streamGenerateContent?alt=sse``) with a short fixed text, so the CLI
finishes its turn and exits.
"""

from __future__ import annotations

import json
import time
from typing import Any

import zstandard
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from polar.httpserver import ThreadedUvicorn, bind, uvicorn_config

REPLY = "I looked at the repository. Done."
SHELL_TOOLS = ("Bash", "exec_command", "run_shell_command", "bash", "shell")
#: The tool call the server sends back first (``tool_first=True``): a shell command that fixes the
#: swe_mini ``median`` task, so a run through it ends with a passing verifier.
FIX_MEDIAN = (
    "python3 -c \"import pathlib; p = pathlib.Path('stats_lite/core.py'); "
    "p.write_text(p.read_text().replace('return values[len(values) // 2]', "
    "'n = len(values)\\n    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2'))\""
)


def shell_tool(tools: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(tool name, argument name) of the request's shell tool, in any provider's tool shape."""
    flat = []
    for t in tools or []:
        flat += t.get("functionDeclarations") or [t.get("function") or t]
    for t in flat:
        if t.get("name") in SHELL_TOOLS:
            schema = t.get("parameters") or t.get("input_schema") or t.get("parametersJsonSchema") or {}
            props = schema.get("properties") or {}
            return t["name"], "cmd" if "cmd" in props and "command" not in props else "command"
    return None


def has_tool_result(body: dict[str, Any]) -> bool:
    for m in body.get("messages") or []:
        if m.get("role") == "tool":
            return True
        if isinstance(m.get("content"), list) and any(c.get("type") == "tool_result" for c in m["content"] if isinstance(c, dict)):
            return True
    if isinstance(body.get("input"), list) and any(i.get("type") == "function_call_output" for i in body["input"]):
        return True
    return any("functionResponse" in p for c in body.get("contents") or [] for p in c.get("parts") or [])


def _sse(events: list[tuple[str | None, dict[str, Any]]], done: bool = False) -> StreamingResponse:
    def gen():
        for name, data in events:
            if name:
                yield f"event: {name}\n"
            yield f"data: {json.dumps(data)}\n\n"
        if done:
            yield "data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


def anthropic_reply(body: dict[str, Any], call: tuple[str, str] | None = None) -> Response:
    model = body.get("model", "m")
    msg = {
        "id": "msg_capture",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    if call is not None:
        block = {"type": "tool_use", "id": "toolu_capture1", "name": call[0], "input": {}}
        args = json.dumps({call[1]: FIX_MEDIAN})
        if not body.get("stream"):
            return JSONResponse({**msg, "content": [{**block, "input": json.loads(args)}], "stop_reason": "tool_use"})
        return _sse([
            ("message_start", {"type": "message_start", "message": msg}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": args}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 20}}),
            ("message_stop", {"type": "message_stop"}),
        ])
    if not body.get("stream"):
        return JSONResponse({**msg, "content": [{"type": "text", "text": REPLY}], "stop_reason": "end_turn"})
    return _sse([
        ("message_start", {"type": "message_start", "message": msg}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": REPLY}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 8}}),
        ("message_stop", {"type": "message_stop"}),
    ])


def responses_reply(body: dict[str, Any], call: tuple[str, str] | None = None) -> Response:
    model = body.get("model", "m")
    now = int(time.time())
    item = {
        "id": "msg_capture",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": REPLY, "annotations": []}],
    }
    base = {"id": "resp_capture", "object": "response", "created_at": now, "model": model, "status": "in_progress", "output": []}
    done = {**base, "status": "completed", "output": [item],
            "usage": {"input_tokens": 10, "output_tokens": 8, "total_tokens": 18,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}
    if call is not None:
        fc = {"id": "fc_capture1", "type": "function_call", "status": "completed", "call_id": "call_capture1",
              "name": call[0], "arguments": json.dumps({call[1]: FIX_MEDIAN})}
        done = {**done, "output": [fc]}
        if not body.get("stream"):
            return JSONResponse(done)
        return _sse([
            ("response.created", {"type": "response.created", "sequence_number": 0, "response": base}),
            ("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": {**fc, "status": "in_progress", "arguments": ""}}),
            ("response.function_call_arguments.delta", {"type": "response.function_call_arguments.delta", "sequence_number": 2, "item_id": "fc_capture1", "output_index": 0, "delta": fc["arguments"]}),
            ("response.function_call_arguments.done", {"type": "response.function_call_arguments.done", "sequence_number": 3, "item_id": "fc_capture1", "output_index": 0, "arguments": fc["arguments"]}),
            ("response.output_item.done", {"type": "response.output_item.done", "sequence_number": 4, "output_index": 0, "item": fc}),
            ("response.completed", {"type": "response.completed", "sequence_number": 5, "response": done}),
        ])
    if not body.get("stream"):
        return JSONResponse(done)
    partial = {**item, "status": "in_progress", "content": []}
    return _sse([
        ("response.created", {"type": "response.created", "sequence_number": 0, "response": base}),
        ("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": partial}),
        ("response.content_part.added", {"type": "response.content_part.added", "sequence_number": 2, "item_id": "msg_capture", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
        ("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 3, "item_id": "msg_capture", "output_index": 0, "content_index": 0, "delta": REPLY}),
        ("response.output_text.done", {"type": "response.output_text.done", "sequence_number": 4, "item_id": "msg_capture", "output_index": 0, "content_index": 0, "text": REPLY}),
        ("response.content_part.done", {"type": "response.content_part.done", "sequence_number": 5, "item_id": "msg_capture", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": REPLY, "annotations": []}}),
        ("response.output_item.done", {"type": "response.output_item.done", "sequence_number": 6, "output_index": 0, "item": item}),
        ("response.completed", {"type": "response.completed", "sequence_number": 7, "response": done}),
    ])


def chat_reply(body: dict[str, Any], call: tuple[str, str] | None = None) -> Response:
    model = body.get("model", "m")
    now = int(time.time())
    if call is not None:
        tc = {"id": "call_capture1", "type": "function", "function": {"name": call[0], "arguments": json.dumps({call[1]: FIX_MEDIAN})}}
        head = {"id": "chatcmpl-capture", "object": "chat.completion.chunk", "created": now, "model": model}
        if not body.get("stream"):
            return JSONResponse({
                "id": "chatcmpl-capture", "object": "chat.completion", "created": now, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [tc]}, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30},
            })
        events = [
            (None, {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": [{"index": 0, **tc}]}, "finish_reason": None}]}),
            (None, {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        ]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append((None, {**head, "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}}))
        return _sse(events, done=True)
    if not body.get("stream"):
        return JSONResponse({
            "id": "chatcmpl-capture", "object": "chat.completion", "created": now, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18},
        })
    head = {"id": "chatcmpl-capture", "object": "chat.completion.chunk", "created": now, "model": model}
    events = [
        (None, {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}),
        (None, {**head, "choices": [{"index": 0, "delta": {"content": REPLY}, "finish_reason": None}]}),
        (None, {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    ]
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append((None, {**head, "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18}}))
    return _sse(events, done=True)


def gemini_reply(path: str, call: tuple[str, str] | None = None) -> Response:
    parts: list[dict[str, Any]] = [{"text": REPLY}]
    if call is not None:
        parts = [{"functionCall": {"name": call[0], "args": {call[1]: FIX_MEDIAN}}}]
    chunk = {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 8, "totalTokenCount": 18},
        "modelVersion": path.split("/models/")[-1].split(":")[0],
    }
    if path.endswith(":streamGenerateContent"):
        return _sse([(None, chunk)])
    if path.endswith(":countTokens"):
        return JSONResponse({"totalTokens": 10})
    return JSONResponse(chunk)


class CaptureServer:
    """Runs the recording app on 127.0.0.1 in a background thread; ``requests`` holds what arrived."""

    def __init__(self, tool_first: bool = False) -> None:
        self.tool_first = tool_first
        self.requests: list[dict[str, Any]] = []
        self.app = Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "POST", "HEAD", "PUT", "DELETE"])])
        self._uv: ThreadedUvicorn | None = None
        self.port = 0

    async def handle(self, request: Request) -> Response:
        raw = await request.body()
        if request.headers.get("content-encoding", "").lower() == "zstd":
            raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        path = "/" + request.path_params["path"]
        self.requests.append({
            "t": round(time.monotonic(), 3),
            "method": request.method,
            "path": path,
            "query": dict(request.query_params),
            "headers": dict(request.headers),
            "body": body,
        })
        b = body if isinstance(body, dict) else {}
        call = shell_tool(b.get("tools") or []) if self.tool_first and not has_tool_result(b) else None
        if request.method != "POST":
            if path.endswith("/models"):
                return JSONResponse({"object": "list", "data": []})
            return JSONResponse({"error": {"message": f"not found: {path}"}}, status_code=404)
        if path.endswith("/messages/count_tokens"):
            return JSONResponse({"input_tokens": 10})
        if path.endswith("/messages"):
            return anthropic_reply(b, call)
        if path.endswith("/responses"):
            return responses_reply(b, call)
        if path.endswith("/chat/completions"):
            return chat_reply(b, call)
        if "/models/" in path:
            return gemini_reply(path, call)
        return JSONResponse({"error": {"message": f"not found: {path}"}}, status_code=404)

    def start(self) -> str:
        sock = bind("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self._uv = ThreadedUvicorn(uvicorn_config(self.app, server_name="capture server", log_level="warning"), sock,
                                   f"capture-server:{self.port}")
        if not self._uv.start(10.0):
            self.stop()
            raise RuntimeError("capture server did not start within 10 s")
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._uv is not None:
            self._uv.stop(10.0)
            self._uv = None
