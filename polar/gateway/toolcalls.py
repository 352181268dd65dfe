"""Tool-call parsing for Hermes/Qwen chat templates: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

The model's raw text is split into the assistant's visible content (text before the first tag) and a
list of tool calls. A block that is not valid JSON is kept as text and reported, so malformed calls
are visible to the caller (and stay a negative example for training) instead of silently vanishing.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] | str  # dict when the model emitted a JSON object
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    @property
    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class ParsedOutput:
    content: str
    tool_calls: list[ToolCall]
    parse_error: str | None = None


def parse_hermes(text: str) -> ParsedOutput:
    """Split model text into content and tool calls; content is the text before the first tag."""
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return ParsedOutput(text, [])
    calls: list[ToolCall] = []
    errors: list[str] = []
    for m in _BLOCK.finditer(text, start):
        raw = m.group(1).strip()
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            errors.append(f"tool call is not valid JSON ({e.msg} at char {e.pos}): {raw[:200]!r}")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            errors.append(f"tool call JSON needs a string 'name': {raw[:200]!r}")
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        calls.append(ToolCall(obj["name"], args if isinstance(args, (dict, str)) else {"value": args}))
    if not calls:  # nothing usable: hand the raw text back rather than dropping it
        return ParsedOutput(text, [], "; ".join(errors) or "empty tool call")
    return ParsedOutput(text[:start].rstrip(), calls, "; ".join(errors) or None)
