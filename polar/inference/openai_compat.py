"""``engine: openai_compat``: a chat model behind any ``/v1/chat/completions`` endpoint (a hosted API, vLLM's
own chat server, another polar gateway), as a text-level engine.

Every other engine takes token ids; such an endpoint takes messages and renders them with its own template,
so this engine is served at the message level (:meth:`OpenAICompatEngine.chat`): the gateway forwards the
messages, tools and sampling parameters and gets back text, tool calls and, where the endpoint returns them,
token ids and logprobs (vLLM with ``token_ids: true``: ``return_token_ids``, ``logprobs``,
``return_tokens_as_token_ids``). Without them the gateway records the text and writes the call's ids in the
engine's local ``tokenizer`` (the student's, for ``polar generate``) with no logprobs (``logprob_mode: none``);
docs/inference.md says what that loses.

The API key is read from the environment variable ``api_key_env`` at each call, sent only in the
``Authorization`` header, never stored on the engine, never logged, and cut out of any error text an
endpoint echoes back. A 429 (and a 503) is retried with exponential backoff, honouring ``Retry-After``, at
most ``max_retries`` times; every other failure is one line naming the key and the status.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from pydantic import Field

from polar.config.base import StrictModel
from polar.inference.base import Engine, EngineError, GenerationRequest, TokenEvent, UpstreamUnavailable
from polar.types import CREDENTIAL_ENV

log = logging.getLogger(__name__)

RETRY_STATUSES = (429, 503)


class OpenAICompatConfig(StrictModel):
    """Where the chat endpoint is and how to call it. ``config_key`` names the section in errors."""

    base_url: str = Field(description="the endpoint's base URL, up to /v1 (e.g. http://127.0.0.1:8000/v1)")
    model: str = Field(description="the model name the endpoint serves (its 'model' field)")
    api_key_env: str | None = Field(None, description="the environment variable holding the API key (never the key)")
    tokenizer: str = Field("tiny", description="local tokenizer the gateway writes record ids in: 'tiny', a "
                           "preset or a folder (the student's, for polar generate)")
    model_name: str | None = Field(None, description="the name the gateway serves it as (default: model)")
    context_length: int = Field(32768, ge=16, description="prompt + completion tokens the endpoint accepts")
    timeout_s: float = Field(300.0, gt=0, description="the most one call may take")
    connect_timeout_s: float = Field(10.0, gt=0)
    max_retries: int = Field(4, ge=0, le=20, description="retries of a 429/503, with exponential backoff")
    backoff_s: float = Field(1.0, gt=0, description="first backoff; doubles per retry (Retry-After wins)")
    max_backoff_s: float = Field(30.0, gt=0, description="the longest single wait before a retry")
    probe: bool = Field(True, description="at start, GET {base_url}/models once: an unreachable URL or a refused "
                        "key fails there, in one line, rather than in every session")
    token_ids: bool = Field(False, description="ask for token ids and logprobs (vLLM: return_token_ids, "
                            "logprobs, return_tokens_as_token_ids); hosted APIs refuse these fields")
    config_key: str = "model"


@dataclass
class ChatResult:
    """The end of one chat call: what the endpoint answered, with ids and logprobs where it returned them."""

    content: str
    tool_calls: list[dict[str, Any]]  # [{"id", "name", "arguments": str}]
    finish_reason: str  # stop | length | tool_calls | abort
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_ids: list[int] | None = None
    sampled_ids: list[int] | None = None
    logprobs: list[float] | None = None
    logprob_content: list[dict[str, Any]] | None = None  # OpenAI's logprobs.content, as the endpoint sent it
    retries: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _finish(reason: Any) -> str:
    if reason in ("length", "tool_calls", "stop"):
        return str(reason)
    if reason == "function_call":
        return "tool_calls"
    return "stop" if reason else "abort"


def _token_id(entry: dict[str, Any]) -> int | None:
    tok = entry.get("token")
    if isinstance(tok, str) and tok.startswith("token_id:"):
        try:
            return int(tok[9:])
        except ValueError:
            return None
    return None


class OpenAICompatEngine(Engine):
    """A remote chat model. ``text_level``: the gateway calls :meth:`chat`, never :meth:`generate`."""

    text_level = True
    logprob_mode = "none"  # set per call when the endpoint returns logprobs

    def __init__(self, config: OpenAICompatConfig, tokenizer: Any | None = None) -> None:
        from polar.inference.upstream.tokenizer import load_tokenizer, stop_token_ids

        self.config = config
        self.base_url = config.base_url.rstrip("/")
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.tokenizer)
        self.model_name = config.model_name or config.model
        self.context_length = config.context_length
        self.policy_version = 0
        self.default_stop_token_ids = stop_token_ids(self.tokenizer)
        if config.api_key_env:  # the key's variable never reaches a harness process (runners drop it)
            CREDENTIAL_ENV.add(config.api_key_env)
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        # every call samples at this temperature when set (an evaluation's deterministic: 0, greedy)
        self.temperature_override: float | None = None

    # ---- the key and errors ------------------------------------------------------------------------------

    def _key_name(self) -> str:
        return f"{self.config.config_key}.api_key_env"

    def api_key(self) -> str | None:
        """The key, read now from the named variable (never kept): ``None`` when no variable is named."""
        name = self.config.api_key_env
        if not name:
            return None
        key = os.environ.get(name)
        if not key:
            raise EngineError(f"{self._key_name()} names ${name}, which is not set (or empty) in polar's "
                              f"environment; export {name}=<your key> before starting (the key is never written)")
        return key

    def check_key(self) -> None:
        """Fail at build time, in one line, when the named key variable is missing or is not a name."""
        name = self.config.api_key_env
        if name is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise EngineError(f"{self._key_name()} must name an environment variable (letters, digits, '_'); put "
                              "the variable's name there, never the key itself (the value is not repeated here)")
        self.api_key()

    def check_reachable(self) -> None:
        """``GET {base_url}/models`` once: an unreachable URL or a refused key (401/403) is one line now, not an
        error in every session. Any other answer (404 included: not every server lists models) passes."""
        key = self.api_key()
        headers = {"authorization": f"Bearer {key}"} if key else {}
        try:
            with httpx.Client(timeout=httpx.Timeout(self.config.connect_timeout_s * 3,
                                                    connect=self.config.connect_timeout_s)) as client:
                r = client.get(f"{self.base_url}/models", headers=headers)
        except httpx.TimeoutException as e:
            raise UpstreamUnavailable(f"{self._where()} did not answer GET /models within "
                                      f"{self.config.connect_timeout_s * 3:g}s ({type(e).__name__}); check the URL "
                                      "and the server") from None
        except httpx.HTTPError as e:
            raise UpstreamUnavailable(f"{self._where()} is unreachable ({type(e).__name__}: "
                                      f"{self._redact(str(e), key)}); check the URL and that the server "
                                      "is running") from None
        if r.status_code in (401, 403):
            raise self._status_error(r.status_code, r.text, key, 0)

    def _redact(self, text: str, key: str | None) -> str:
        return text.replace(key, "***") if key else text

    def _option(self, name: str) -> str:
        """Where an option is set: ``model.engine_kwargs.NAME`` in a config section."""
        return f"{self.config.config_key}.engine_kwargs.{name}"

    def _where(self) -> str:
        return f"{self.config.config_key}.base_url {self.base_url}"

    def _status_error(self, status: int, body: str, key: str | None, retries: int) -> EngineError:
        detail = self._redact(" ".join(body.split())[:200], key)
        if status in (401, 403):
            return EngineError(
                f"{self._key_name()} (${self.config.api_key_env or 'unset'}): {self._where()} refused the key "
                f"(HTTP {status}: {detail}); check the key in that variable")
        if status == 429:
            return UpstreamRateLimited(
                f"{self._where()}: rate limited (HTTP 429) after {retries} retries ({self._key_name()} "
                f"${self.config.api_key_env or 'unset'}); lower the concurrency or raise "
                f"{self._option('max_retries')}: {detail}")
        return EngineError(f"{self._where()} answered HTTP {status} for model {self.config.model!r}: {detail}")

    # ---- HTTP ----------------------------------------------------------------------------------------------

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            timeout = httpx.Timeout(self.config.timeout_s, connect=self.config.connect_timeout_s)
            self._client = httpx.AsyncClient(timeout=timeout)
            self._client_loop = loop
        return self._client

    def _backoff_s(self, attempt: int, response: httpx.Response) -> float:
        given = response.headers.get("retry-after")
        if given is not None:
            try:
                return min(max(float(given), 0.0), self.config.max_backoff_s)
            except ValueError:
                pass  # an HTTP date: fall back to our own backoff
        base = self.config.backoff_s * (2 ** attempt)
        return min(base * (0.5 + random.random() / 2), self.config.max_backoff_s)

    def body(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], tool_choice: str,
             max_tokens: int | None, temperature: float, top_p: float, stop: list[str], seed: int | None,
             stream: bool) -> dict[str, Any]:
        """The chat request: normalized messages in OpenAI's wire form (tool-call arguments as JSON strings)."""
        if self.temperature_override is not None:
            temperature = self.temperature_override
        body: dict[str, Any] = {"model": self.config.model, "messages": [_wire(m) for m in messages],
                                "temperature": temperature, "top_p": top_p, "stream": stream}
        if max_tokens:
            body["max_tokens"] = max_tokens
        if stop:
            body["stop"] = stop
        if seed is not None:
            body["seed"] = seed
        if tools:
            body["tools"] = tools
            if tool_choice in ("auto", "none", "required"):
                body["tool_choice"] = tool_choice
            else:
                body["tool_choice"] = {"type": "function", "function": {"name": tool_choice}}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.config.token_ids:
            body.update(logprobs=True, return_token_ids=True, return_tokens_as_token_ids=True)
        return body

    async def _open(self, body: dict[str, Any]) -> tuple[httpx.Response, int]:
        """POST, retrying 429/503 with backoff; returns the open (unread) 200 response and the retries made."""
        key = self.api_key()
        headers = {"content-type": "application/json"}
        if key:
            headers["authorization"] = f"Bearer {key}"
        client = self._http()
        url = f"{self.base_url}/chat/completions"
        payload = orjson.dumps(body)
        attempt = 0
        while True:
            try:
                req = client.build_request("POST", url, content=payload, headers=headers)
                resp = await client.send(req, stream=True)
            except httpx.TimeoutException as e:
                raise UpstreamUnavailable(f"{self._where()} did not answer within its timeout "
                                          f"({type(e).__name__}); check the server, or raise "
                                          f"{self._option('timeout_s')}") from None
            except httpx.HTTPError as e:
                raise UpstreamUnavailable(f"{self._where()} is unreachable ({type(e).__name__}: "
                                          f"{self._redact(str(e), key)}); check the URL and that the server "
                                          "is running") from None
            if resp.status_code == 200:
                return resp, attempt
            text = (await resp.aread()).decode("utf-8", "replace")
            await resp.aclose()
            if resp.status_code in RETRY_STATUSES and attempt < self.config.max_retries:
                wait_s = self._backoff_s(attempt, resp)
                log.warning("%s: HTTP %d, retry %d/%d in %.1fs", self._where(), resp.status_code, attempt + 1,
                            self.config.max_retries, wait_s)
                attempt += 1
                await asyncio.sleep(wait_s)
                continue
            raise self._status_error(resp.status_code, text, key, attempt)

    async def chat(self, body: dict[str, Any]) -> AsyncIterator[str | ChatResult]:
        """Stream a chat call: text deltas as they arrive, then one :class:`ChatResult`. Errors before the
        first delta raise :class:`EngineError` (one line: the key, the URL, the status)."""
        resp, retries = await self._open(body)
        try:
            if body.get("stream"):
                async for item in self._read_stream(resp, retries):
                    yield item
            else:
                raw = await resp.aread()
                yield self._read_whole(raw, retries)
        finally:
            await resp.aclose()

    def _read_whole(self, raw: bytes, retries: int) -> ChatResult:
        try:
            data = orjson.loads(raw)
            choice = data["choices"][0]
            msg = choice.get("message") or {}
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            raise EngineError(f"{self._where()} answered with no chat completion: {raw[:200]!r}") from None
        calls = [{"id": c.get("id") or "", "name": (c.get("function") or {}).get("name", ""),
                  "arguments": (c.get("function") or {}).get("arguments") or ""} for c in msg.get("tool_calls") or []]
        usage = data.get("usage") or {}
        lp_content = (choice.get("logprobs") or {}).get("content")
        result = ChatResult(content=msg.get("content") or "", tool_calls=calls,
                            finish_reason=_finish(choice.get("finish_reason")),
                            prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
                            prompt_ids=data.get("prompt_token_ids"), sampled_ids=choice.get("token_ids"),
                            logprob_content=lp_content, retries=retries)
        _fill_logprobs(result)
        return result

    async def _read_stream(self, resp: httpx.Response, retries: int) -> AsyncIterator[str | ChatResult]:
        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        result = ChatResult(content="", tool_calls=[], finish_reason="abort", retries=retries)
        lp_content: list[dict[str, Any]] = []
        sampled: list[int] = []
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data_s = line[5:].strip()
            if data_s == "[DONE]":
                break
            try:
                data = orjson.loads(data_s)
            except orjson.JSONDecodeError:
                raise EngineError(f"{self._where()} streamed a line that is not JSON: {data_s[:200]!r}") from None
            if "error" in data and not data.get("choices"):
                raise EngineError(f"{self._where()} failed mid-stream: {str(data['error'])[:200]}")
            if data.get("prompt_token_ids") is not None:
                result.prompt_ids = list(data["prompt_token_ids"])
            usage = data.get("usage")
            if usage:
                result.prompt_tokens = usage.get("prompt_tokens")
                result.completion_tokens = usage.get("completion_tokens")
            for choice in data.get("choices") or []:
                delta = choice.get("delta") or {}
                if choice.get("prompt_token_ids") is not None:
                    result.prompt_ids = list(choice["prompt_token_ids"])
                if choice.get("token_ids"):
                    sampled.extend(int(t) for t in choice["token_ids"])
                lp = (choice.get("logprobs") or {}).get("content")
                if lp:
                    lp_content.extend(lp)
                text = delta.get("content")
                if text:
                    content.append(text)
                    yield text
                for tc in delta.get("tool_calls") or []:
                    slot = calls.setdefault(int(tc.get("index", 0)), {"id": "", "name": "", "arguments": ""})
                    slot["id"] = tc.get("id") or slot["id"]
                    fn = tc.get("function") or {}
                    slot["name"] += fn.get("name") or ""
                    slot["arguments"] += fn.get("arguments") or ""
                if choice.get("finish_reason"):
                    result.finish_reason = _finish(choice["finish_reason"])
        result.content = "".join(content)
        result.tool_calls = [calls[i] for i in sorted(calls)]
        result.sampled_ids = sampled or None
        result.logprob_content = lp_content or None
        _fill_logprobs(result)
        yield result

    # ---- the Engine interface ------------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        raise EngineError(f"{self.config.config_key}.engine: openai_compat takes messages, not token ids; it "
                          "serves through the gateway's chat path only")
        yield  # pragma: no cover - makes this an async generator

    async def update_weights(self, state_dict: Any, version: int) -> None:
        raise EngineError(f"{self.config.config_key}.engine: openai_compat serves a remote model; there are no "
                          "weights to update")

    async def health(self) -> dict[str, Any]:
        return {"state": "ok", "base_url": self.base_url, "model": self.config.model}

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            try:
                await client.aclose()
            except RuntimeError:  # its loop is gone already
                pass


class UpstreamRateLimited(EngineError):
    """The endpoint kept answering 429 after every retry."""


def _fill_logprobs(result: ChatResult) -> None:
    """Sampled ids from ``token_id:N`` logprob entries when the endpoint gave no ``token_ids``; logprobs when
    every entry carries one (otherwise none: a partial list would misalign with the ids)."""
    content = result.logprob_content
    if not content:
        return
    if result.sampled_ids is None:
        ids = [_token_id(e) for e in content]
        if all(i is not None for i in ids):
            result.sampled_ids = [int(i) for i in ids if i is not None]
    lps = [e.get("logprob") for e in content]
    if all(isinstance(x, (int, float)) for x in lps):
        result.logprobs = [float(x) for x in lps if x is not None]


def _wire(m: dict[str, Any]) -> dict[str, Any]:
    """A normalized message as OpenAI's wire form: tool-call arguments as JSON strings."""
    out = dict(m)
    calls = m.get("tool_calls")
    if calls:
        out["tool_calls"] = [
            {"id": c.get("id") or f"call_{i}", "type": "function",
             "function": {"name": c["function"]["name"],
                          "arguments": c["function"]["arguments"] if isinstance(c["function"]["arguments"], str)
                          else orjson.dumps(c["function"]["arguments"]).decode()}}
            for i, c in enumerate(calls)]
        if not out.get("content"):
            out["content"] = None
    return out


def build_openai_compat(spec: str, *, base_url: str | None = None, api_key_env: str | None = None,
                        config_key: str = "model", **options: Any) -> OpenAICompatEngine:
    """``load_engine(model_name, engine="openai_compat", base_url=..., api_key_env=..., ...)``: checked in
    one line (no URL, a bad option, a missing key variable) before any call is made."""
    from pydantic import ValidationError

    section = config_key.rsplit(".", 1)[0] if "." in config_key else config_key
    if not base_url:
        raise EngineError(f"{section}.base_url is required with engine: openai_compat "
                          "(e.g. base_url: https://api.example.com/v1)")
    if not base_url.startswith(("http://", "https://")):
        raise EngineError(f"{section}.base_url {base_url!r} must start with http:// or https://")
    clash = sorted(set(options) & {"model", "config_key"})
    if clash:
        raise EngineError(f"{section}.engine_kwargs.{clash[0]} is not an option here; the endpoint's model name is "
                          f"{section}.model")
    try:
        cfg = OpenAICompatConfig(base_url=base_url, model=spec, api_key_env=api_key_env, config_key=section,
                                 **options)
    except ValidationError as e:
        first = e.errors()[0]
        raise EngineError(f"{section}.engine_kwargs.{'.'.join(str(p) for p in first['loc'])}: {first['msg']} "
                          "(engine: openai_compat options: base_url, model, api_key_env, tokenizer, "
                          f"{', '.join(sorted(set(OpenAICompatConfig.model_fields) - {'base_url', 'model', 'api_key_env', 'tokenizer', 'config_key'}))})") from None
    engine = OpenAICompatEngine(cfg)
    engine.check_key()
    if cfg.probe:
        engine.check_reachable()
    return engine
