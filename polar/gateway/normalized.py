"""The provider-neutral request and result every provider module converts to and from.

Messages are normalized to an OpenAI-chat-like shape, which is also what HF chat templates take::

    {"role": "system" | "user" | "assistant" | "tool", "content": str,
     "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": dict | str}}],  # assistant
     "tool_call_id": str, "name": str}                                                           # tool

Tools are OpenAI function tools: ``{"type": "function", "function": {"name", "description", "parameters"}}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from polar.gateway.toolcalls import ToolCall


def canonical_json(obj: Any) -> bytes:
    """Key-sorted compact JSON bytes: for hashing and comparing normalized messages, tools and schemas."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)

Message = dict[str, Any]


@dataclass
class ChatRequest:
    provider: str  # openai_chat | openai_responses | anthropic | gemini
    model: str
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str = "auto"  # auto | none | required | <function name>
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    stream: bool = False
    logprobs: bool = False  # OpenAI chat: return per-token logprobs to the client
    top_logprobs: int = 0  # OpenAI chat: that many most likely alternatives per token (needs logprobs)
    include_usage: bool = False  # OpenAI chat streaming: stream_options.include_usage


@dataclass
class CallOutput:
    """What one call produced, in provider-neutral terms."""

    text: str  # raw decoded text (after a stop string is cut)
    content: str  # visible assistant text (before any tool call)
    tool_calls: list[ToolCall]
    finish: str  # stop | length | tool_calls | stop_sequence | abort
    stop_sequence: str | None
    prompt_tokens: int
    sampled_ids: list[int]
    logprobs: list[float]
    call_index: int = -1
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per sampled token, when the request asked
    tool_parse_error: str | None = None
    completion_tokens_reported: int | None = None  # a text-level engine: the endpoint's own count
    logprob_content: list[dict[str, Any]] | None = None  # a text-level engine: OpenAI logprobs as the endpoint sent them

    @property
    def completion_tokens(self) -> int:
        if self.completion_tokens_reported is not None:
            return self.completion_tokens_reported
        return len(self.sampled_ids)


def text_parts(content: Any, where: str, allowed: tuple[str, ...], text_key: str = "text") -> str:
    """Join a string or a list of text parts; any other part type is a clear 400."""
    from polar.gateway.errors import bad

    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"{where} must be a string or a list of content parts (got {type(content).__name__})", where)
    out = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            out.append(part)
            continue
        if not isinstance(part, dict):
            raise bad(f"{where}[{i}] must be an object (got {type(part).__name__})", f"{where}[{i}]")
        kind = part.get("type", "text")
        if kind not in allowed:
            raise bad(
                f"{where}[{i}].type {kind!r} is not supported: this gateway serves a text-only model; "
                f"use one of {', '.join(allowed)}",
                f"{where}[{i}].type",
            )
        text = part.get(text_key)
        if not isinstance(text, str):
            raise bad(f"{where}[{i}].{text_key} must be a string", f"{where}[{i}].{text_key}")
        out.append(text)
    return "\n".join(out)


def parse_arguments(args: Any) -> dict[str, Any] | str:
    """Tool-call arguments as a dict when they are a JSON object, else the raw string."""
    import json

    if isinstance(args, dict):
        return args
    if isinstance(args, str):
        try:
            obj = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return args
        return obj if isinstance(obj, dict) else args
    return {} if args is None else str(args)
