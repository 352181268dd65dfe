"""Which chat template an engine's tokenizer renders with, so every model can be offered tools.

The gateway parses Hermes tool calls (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``), and
an engine's tokenizer must render tools (see :class:`polar.inference.base.Engine`). Many instruct models'
own templates cannot (SmolLM2's ChatML template ignores ``tools``). :func:`choose_chat_template` picks,
once per engine:

- ``model.chat_template`` when set: ``"model"`` (the model's own), a built-in name (``hermes-tools``),
  or a Jinja file;
- else the model's own template when it renders tools;
- else, for a ChatML tokenizer, the built-in ``hermes-tools`` template, with the model's own default
  system prompt, so a conversation without tools renders as the model's template renders it;
- else the model's own, and a call that asks for tools gets a one-line error naming the config key.

The choice is set on the tokenizer (the gateway, the learner and SFT demonstrations all render with
it), logged, and recorded with every call (``metadata.chat_template``: ``model``,
``builtin:hermes-tools`` or ``file:PATH``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from polar.inference.base import EngineError

log = logging.getLogger(__name__)

HERMES_TOOLS = "hermes-tools"
#: Where a template override is set (named in errors).
CONFIG_KEY = "model.chat_template (polar gateway: --chat-template or gateway.chat_template)"
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

_PROBE_TOOL = "polar_probe_tool_7f3a"
_PROBE_CALL = "polar_probe_call_91c2"
_PROBE_RESULT = "polar_probe_result_5d0e"


def hermes_tools_template(default_system: str = DEFAULT_SYSTEM_PROMPT) -> str:
    """A Qwen2.5-style ChatML template with Hermes tools (system, user, assistant with ``tool_calls``,
    ``tool`` results, tools listed in the system prompt). Differences from upstream Qwen2.5: arguments
    given as a JSON *string* (OpenAI wire format) are emitted verbatim rather than double-encoded, and
    list-of-parts content is joined from its text parts."""
    system = json.dumps(default_system)  # a Jinja string literal (same escapes as JSON)
    return (
        r"""{%- macro render_content(content) -%}
{%- if content is none -%}
{%- elif content is string -%}{{- content -}}
{%- else -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- render_content(messages[0].content) }}
    {%- else %}
        {{- """
        + system
        + r""" }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + render_content(messages[0].content) + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\n' + """
        + system
        + r""" + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + render_content(message.content) }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- render_content(message.content) }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
    )


def renders_tools(tokenizer: Any, template: str | None) -> bool:
    """Whether ``template`` shows the tools offered, an assistant's tool call and a tool's result.

    A template whose source never mentions ``tools`` cannot; one that does must also render a probe
    conversation with all three visible (some accept ``tools`` and drop them)."""
    if not isinstance(template, str) or "tools" not in template:
        return False
    tools = [{"type": "function", "function": {"name": _PROBE_TOOL, "description": "probe",
                                               "parameters": {"type": "object", "properties": {}}}}]
    messages = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": _PROBE_CALL, "arguments": {"x": 1}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": _PROBE_RESULT},
    ]
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=False,
                                             add_generation_prompt=True)
    except Exception:
        return False
    return isinstance(text, str) and all(s in text for s in (_PROBE_TOOL, _PROBE_CALL, _PROBE_RESULT))


def _is_chatml(tokenizer: Any) -> bool:
    unk = getattr(tokenizer, "unk_token_id", None)
    for tok in ("<|im_start|>", "<|im_end|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if not isinstance(tid, int) or tid < 0 or tid == unk:
            return False
    return True


def _default_system(tokenizer: Any, template: str | None) -> str:
    """The system prompt ``template`` adds when a conversation has none (ChatML), else polar's default."""
    marker = "\x1fpolar-probe-user\x1f"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], chat_template=template,
                                             tokenize=False)
    except Exception:
        return DEFAULT_SYSTEM_PROMPT
    head = "<|im_start|>system\n"
    end = text.find(f"<|im_end|>\n<|im_start|>user\n{marker}")
    if text.startswith(head) and end >= 0:
        return text[len(head):end]
    return DEFAULT_SYSTEM_PROMPT


def _load_override(override: str) -> tuple[str | None, str]:
    """(template text, recorded label) for a ``chat_template`` setting; ``None`` text: the model's own."""
    name = override.removeprefix("builtin:")
    if name == "model":
        return None, "model"
    if name == HERMES_TOOLS:
        return "", f"builtin:{HERMES_TOOLS}"  # filled in with the model's default system prompt
    path = Path(override).expanduser()
    if not path.is_file():
        raise EngineError(
            f"chat template {override!r} is neither a built-in name ({HERMES_TOOLS}, model) nor a file; "
            f"fix {CONFIG_KEY}"
        )
    try:
        return path.read_text(encoding="utf-8"), f"file:{path.resolve()}"
    except (OSError, UnicodeDecodeError) as e:
        raise EngineError(f"chat template file {path} cannot be read ({e}); fix {CONFIG_KEY}") from None


def choose_chat_template(engine: Any, override: str | None = None) -> str:
    """Set ``engine.tokenizer``'s chat template (see the module docstring) and record the choice on the
    engine: ``chat_template_source`` (label) and ``chat_template_tools`` (whether tools render).
    Idempotent without an override. Returns the label."""
    if override is None and getattr(engine, "chat_template_source", None) is not None:
        return engine.chat_template_source
    tokenizer = engine.tokenizer
    own = getattr(tokenizer, "chat_template", None)
    own = own if isinstance(own, str) else None
    if override:
        text, label = _load_override(override)
        if text == "":
            if not _is_chatml(tokenizer):
                raise EngineError(
                    f"the built-in {HERMES_TOOLS} template is ChatML, but this tokenizer has no <|im_start|>/"
                    f"<|im_end|> tokens; point {CONFIG_KEY} at a template file written for this model"
                )
            text = hermes_tools_template(_default_system(tokenizer, own))
    elif renders_tools(tokenizer, own):
        text, label = None, "model"
    elif _is_chatml(tokenizer):
        text, label = hermes_tools_template(_default_system(tokenizer, own)), f"builtin:{HERMES_TOOLS}"
    else:
        text, label = None, "model"
    if text is not None:
        tokenizer.chat_template = text
    tools_ok = renders_tools(tokenizer, tokenizer.chat_template)
    engine.chat_template_source = label
    engine.chat_template_tools = tools_ok
    engine.chat_template_chosen_by = "config" if override else "polar"
    model = getattr(engine, "model_name", "?")
    if label == "model" and not tools_ok:
        log.warning("model %s: chat template 'model' cannot render tools; calls with tools will be refused "
                    "(set %s to a template that renders them)", model, CONFIG_KEY)
    elif override is None and label != "model":
        log.info("model %s: its own chat template cannot render tools, so polar renders with %s", model, label)
    else:
        log.info("model %s: chat template %s", model, label)
    return label


def tools_refusal(engine: Any) -> str | None:
    """Why a call with tools cannot be served by ``engine`` (``None``: it can)."""
    if getattr(engine, "chat_template_tools", True):
        return None
    source = getattr(engine, "chat_template_source", "model")
    why = ("as configured" if getattr(engine, "chat_template_chosen_by", "polar") == "config"
           else "and no tool-capable fallback fits its tokenizer (not ChatML)")
    return (f"the chat template of model {getattr(engine, 'model_name', '?')!r} ({source}) cannot render tools, {why}; "
            f"set {CONFIG_KEY} to a template that renders tools, or call without tools")
