"""Pydantic models of the request bodies, per provider: messages, tools and sampling parameters.

Every model is permissive about fields it does not name (``extra="allow"``: real SDKs send many that do
not change generation here, and the provider modules note those once) and strict about the types of the
fields it does name (no ``"1"`` for 1, no ``1`` for ``true``). ``validate`` turns a ``ValidationError``
into the provider's 400 naming the field (``tools[0].function.parameters``), so every provider reports
bad input the same way.

Tool parameter schemas must be JSON schemas of ``type: "object"`` that pass the JSON-schema meta-schema
(the ``jsonschema`` package's ``check_schema``); the verdict is cached per distinct schema, because
harnesses resend the same tools on every call.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from polar.gateway.errors import ApiError, bad
from polar.gateway.normalized import canonical_json

# Seeds: the signed 64-bit range every engine here takes (torch.Generator.manual_seed, vLLM, SGLang).
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
GEMINI_SEED_MIN, GEMINI_SEED_MAX = -(2**31), 2**31 - 1  # Gemini's generationConfig.seed is an int32
RAW_BODY_KEY = "polar.raw_body"  # the request scope key under which the app keeps the raw body bytes
MID_CONVERSATION_SYSTEM_BETA = "mid-conversation-system-"  # anthropic-beta feature: system turns in messages


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


# ---- nesting --------------------------------------------------------------------------------------

MAX_JSON_DEPTH = 64  # nesting of a request body: records (orjson: 255), schema checks and templates recurse


def depth_problem(obj: Any, limit: int = MAX_JSON_DEPTH) -> str | None:
    """Where ``obj`` nests deeper than ``limit`` arrays/objects, or ``None``. Iterative, so a deep body
    cannot exhaust the stack; one step per array/object (paths are spelled only for the error)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            where = _deep_path(obj, limit)
            where = where if len(where) <= 120 else where[:120] + "..."
            return f"the request body nests deeper than {limit} levels (at '{where}'); flatten it"
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, (dict, list)))
    return None


def _deep_path(obj: Any, limit: int) -> str:
    stack: list[tuple[Any, int, str]] = [(obj, 1, "")]
    while stack:
        node, depth, where = stack.pop()
        if depth > limit:
            return where
        items = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend((v, depth + 1, f"{where}[{k}]" if isinstance(k, int) else (f"{where}.{k}" if where else str(k)))
                     for k, v in items if isinstance(v, (dict, list)))
    return "body"


# ---- tool parameter schemas -------------------------------------------------------------------------

_SCHEMA_VERDICTS: OrderedDict[bytes, str | None] = OrderedDict()  # canonical schema -> error (None: valid)
_MAX_VERDICTS = 4096
_VERDICTS_LOCK = threading.Lock()


def _schema_error(schema: dict[str, Any]) -> str | None:
    if not schema:
        return None  # {}: a function without arguments
    kind = schema.get("type")
    if kind != "object":
        return f"must be a JSON schema of type 'object' (got type {kind!r}); e.g. {{\"type\": \"object\", \"properties\": {{}}}}"
    from jsonschema import Draft202012Validator, SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as e:
        where = "".join(f"[{p!r}]" for p in e.path)
        return f"is not a valid JSON schema: {e.message}" + (f" (at {where})" if where else "")
    return None


def check_tool_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """An object schema that passes the JSON-schema meta-schema, else ``ValueError`` saying why.
    Bodies are validated on worker threads: the verdict cache is shared under a lock."""
    key = canonical_json(schema)
    with _VERDICTS_LOCK:
        cached = key in _SCHEMA_VERDICTS
        if cached:
            _SCHEMA_VERDICTS.move_to_end(key)
            error = _SCHEMA_VERDICTS[key]
    if not cached:
        error = _schema_error(schema)
        with _VERDICTS_LOCK:
            _SCHEMA_VERDICTS[key] = error
            while len(_SCHEMA_VERDICTS) > _MAX_VERDICTS:
                _SCHEMA_VERDICTS.popitem(last=False)
    if error is not None:
        raise ValueError(error)
    return schema


def lower_types(schema: Any) -> Any:
    """Gemini's OpenAPI subset spells types in capitals (``OBJECT``); JSON schema wants lower case."""
    if isinstance(schema, dict):
        return {k: (v.lower() if k == "type" and isinstance(v, str) else lower_types(v)) for k, v in schema.items()}
    if isinstance(schema, list):
        return [lower_types(v) for v in schema]
    return schema


ToolSchema = Annotated[dict[str, Any], AfterValidator(check_tool_schema)]
GeminiToolSchema = Annotated[dict[str, Any], AfterValidator(lambda s: check_tool_schema(lower_types(s)))]


def _seed_range(lo: int, hi: int, what: str) -> AfterValidator:
    def check(seed: int) -> int:
        if not lo <= seed <= hi:
            raise ValueError(f"must be an integer from {lo} to {hi}, {what} (got {seed})")
        return seed

    return AfterValidator(check)


Seed = Annotated[int, _seed_range(SEED_MIN, SEED_MAX, "the engine's seed range")]
Content = str | list[str | dict[str, Any]] | None  # part types are checked where they are read (text_parts)
Stop = str | list[str] | None
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
# Every integer field is bounded: an integer beyond 64 bits cannot be written into a record (orjson), so an
# unbounded one would lose the call's record and break its session (docs/gateway.md, Limits).
MAX_INT_FIELD = 2**31 - 1
PositiveInt = Annotated[int, Field(ge=1, le=MAX_INT_FIELD)]
BoundedInt = Annotated[int, Field(ge=-MAX_INT_FIELD, le=MAX_INT_FIELD)]  # values checked where read
TopK = Annotated[int, Field(ge=-1, le=MAX_INT_FIELD)]  # accepted and ignored; -1 is vLLM's "off"


# ---- OpenAI Chat Completions ------------------------------------------------------------------------

class ChatFunctionCall(_Body):
    name: str
    arguments: str | dict[str, Any] | None = None


class ChatToolCall(_Body):
    id: str | None = None
    function: ChatFunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatFunction(_Body):
    name: str
    description: str | None = None
    parameters: ToolSchema | None = None


class ChatTool(_Body):
    type: str = "function"
    function: ChatFunction | None = None

    @model_validator(mode="after")
    def _function_tools_have_a_function(self) -> ChatTool:
        if self.type == "function" and self.function is None:
            raise ValueError("a function tool needs 'function': {'name': ..., 'parameters': {...}}")
        return self


class ChatBody(_Body):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    n: BoundedInt | None = None
    top_k: TopK | None = None
    stop: Stop = None
    stream: bool | None = None
    logprobs: bool | None = None
    stream_options: dict[str, Any] | None = None


# ---- OpenAI Responses -------------------------------------------------------------------------------

class ResponsesItem(_Body):
    type: str = "message"
    role: Literal["system", "developer", "user", "assistant"] | None = None
    content: Content = None
    call_id: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _messages_have_a_role(self) -> ResponsesItem:
        if self.type == "message" and self.role is None:
            raise ValueError("a message item needs 'role' (system, developer, user or assistant)")
        return self


class ResponsesTool(_Body):
    type: str | None = None
    name: str | None = None
    description: str | None = None
    parameters: ToolSchema | None = None
    tools: list[ResponsesTool] | None = None  # type "namespace" (Codex): a group of function tools

    @model_validator(mode="after")
    def _function_tools_have_a_name(self) -> ResponsesTool:
        if self.type == "function" and self.name is None:
            raise ValueError("a function tool needs 'name'")
        return self


class ResponsesBody(_Body):
    model: str
    input: str | list[ResponsesItem]
    instructions: Content = None
    tools: list[ResponsesTool] | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool | None = None


# ---- Anthropic Messages -----------------------------------------------------------------------------

class AnthropicMessage(_Body):
    role: str
    content: str | list[dict[str, Any]]

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str, info: ValidationInfo) -> str:
        if role in ("user", "assistant"):
            return role
        if role == "system" and (info.context or {}).get("mid_conversation_system"):
            return role  # the anthropic-beta mid-conversation-system feature (Claude Code sends it)
        hint = " (put system text in the top-level 'system' parameter)" if role == "system" else ""
        raise ValueError(f"{role!r} is not supported; Anthropic messages are 'user' or 'assistant'{hint}")


class AnthropicTool(_Body):
    type: str | None = None
    name: str | None = None
    description: str | None = None
    input_schema: ToolSchema | None = None

    @model_validator(mode="after")
    def _custom_tools_have_a_schema(self) -> AnthropicTool:
        if self.type in (None, "custom"):  # client tools; server tools (bash_..., web_search_...) have neither
            if self.name is None:
                raise ValueError("a tool needs 'name'")
            if self.input_schema is None:
                raise ValueError("a tool needs 'input_schema' (a JSON schema of type 'object')")
        return self


class AnthropicBody(_Body):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[AnthropicTool] | None = None
    max_tokens: PositiveInt | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None


# ---- Gemini -----------------------------------------------------------------------------------------

class GeminiContent(_Body):
    role: Literal["user", "model", "function"] = "user"
    parts: list[dict[str, Any]]


class GeminiFunction(_Body):
    name: str
    description: str | None = None
    parameters: GeminiToolSchema | None = None
    parametersJsonSchema: ToolSchema | None = None
    parameters_json_schema: ToolSchema | None = None


class GeminiTool(_Body):
    functionDeclarations: list[GeminiFunction] | None = None
    function_declarations: list[GeminiFunction] | None = None


class GeminiGeneration(_Body):
    maxOutputTokens: PositiveInt | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    topP: TopP | None = None
    top_p: TopP | None = None
    stopSequences: Stop = None
    stop_sequences: Stop = None
    seed: Annotated[int, _seed_range(GEMINI_SEED_MIN, GEMINI_SEED_MAX, "Gemini's int32 seed range")] | None = None
    candidateCount: BoundedInt | None = None
    candidate_count: BoundedInt | None = None
    topK: TopK | None = None
    top_k: TopK | None = None


class GeminiBody(_Body):
    contents: list[GeminiContent] = Field(min_length=1)
    tools: list[GeminiTool] | None = None
    generationConfig: GeminiGeneration | None = None
    generation_config: GeminiGeneration | None = None


# ---- admin -----------------------------------------------------------------------------------------

class AdminWeightsBody(_Body):
    """``POST /admin/weights``."""

    path: str
    policy_version: Annotated[int, Field(ge=0, le=2**63 - 1)]
    timeout_s: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 300.0


# ---- errors -----------------------------------------------------------------------------------------

_TAG = re.compile(r"^(str|int|float|bool|none|dict|list|[a-z-]+\[.*\]|[A-Z]\w*)$")  # union members in a loc


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _TAG.match(part):
            out += f".{part}" if out else part
    return out


def _clean(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(p for p in loc if isinstance(p, int) or not _TAG.match(p))


def _describe(errors: Sequence[Mapping[str, Any]], where: str) -> str:
    first = errors[0]
    kind, value = first["type"], first.get("input")
    if kind == "missing":
        return f"missing required field '{where}'"
    if kind == "too_short":
        return f"'{where}' must contain at least {first['ctx']['min_length']} item(s)"
    if kind == "literal_error":
        return f"'{where}' {value!r} is not supported; use {first['ctx']['expected']}"
    if kind == "value_error":
        text = first["msg"].removeprefix("Value error, ")
        return f"'{where}' {text}" if text.startswith(("must ", "is ")) else f"'{where}': {text}"
    limits = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
    if kind in limits:
        bound = next(iter(first["ctx"].values()))
        return f"'{where}' must be {limits[kind]} {bound} (got {value!r})"
    wants = " or ".join(dict.fromkeys(e["msg"].removeprefix("Input should be ") for e in errors))
    return f"'{where}' must be {wants} (got {type(value).__name__})"


def _error(e: ValidationError) -> ApiError:
    """The first error, as one line naming the field: the deepest of the errors about the same field."""
    errors = e.errors(include_url=False)
    top = _clean(errors[0]["loc"])
    same = [x for x in errors if _clean(x["loc"])[: len(top)] == top]
    depth = max(len(_clean(x["loc"])) for x in same)
    deepest = [x for x in same if len(_clean(x["loc"])) == depth]
    where = _path(deepest[0]["loc"]) or "body"
    return bad(_describe(deepest, where), where)


def _lost_integer(errors: Sequence[Mapping[str, Any]]) -> bool:
    """orjson reads integers beyond 64 bits as floats: an integer field holding a whole float that large."""
    return any(x["type"] == "int_type" and isinstance(x.get("input"), float) and x["input"].is_integer()
               and abs(x["input"]) >= 2**63 for x in errors)


def validate(model: type[_Body], body: dict[str, Any], request: Any = None, **context: Any) -> Any:
    """``model`` validated from ``body``, or the provider's 400 naming the first bad field.

    When a big integer lost its exactness in the fast JSON parser, the raw body (kept by the app under
    ``RAW_BODY_KEY``) is parsed again exactly, so the message quotes the integer the client sent."""
    raw = getattr(request, "scope", {}).pop(RAW_BODY_KEY, None)  # only needed here; do not keep it alive
    try:
        return model.model_validate(body, context=context)
    except ValidationError as e:
        if raw is not None and _lost_integer(e.errors(include_url=False)):
            try:
                return model.model_validate(json.loads(raw), context=context)
            except ValidationError as exact:
                raise _error(exact) from None
        raise _error(e) from None
