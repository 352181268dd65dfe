"""One model call, provider-neutral: prompt ids -> engine -> text deltas -> ``CallOutput`` -> record.

``GatewayCore.start`` does everything that can fail with a clean HTTP error (session call index,
prompt rendering and token reuse, context check, the engine's first event) before a provider commits
to a 200 streaming response. ``Call.events`` then yields text deltas as tokens arrive and finally one
``CallOutput``; its ``finally`` writes the ``CallRecord`` whatever happened (normal end, stop string,
engine error, client disconnect), so no call goes unrecorded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from polar.gateway.drain import DrainGate
from polar.gateway.errors import ApiError, bad
from polar.gateway.logprobs import TokenBytes
from polar.gateway.normalized import CallOutput, ChatRequest
from polar.gateway.prompt import Prompt, PromptBuilder, PromptTooLong, reuse_key, text_sha256
from polar.gateway.sessions import SessionStore
from polar.gateway.textstream import IncrementalDetokenizer, TextStream
from polar.gateway.tokencache import WouldBlock
from polar.gateway.toolcalls import ParsedOutput, parse_hermes
from polar.inference.action_cache import ActionCacheRefused
from polar.inference.base import (
    ContextLengthExceeded,
    Engine,
    EngineError,
    GenerationRequest,
    GenerationResult,
    TokenEvent,
    UpstreamUnavailable,
)
from polar.inference.templates import tools_refusal
from polar.types import CallRecord

log = logging.getLogger(__name__)

# A call whose body is small enough to parse on the event loop (``GatewayCore.start(inline=True)``) also
# builds its prompt there when at most this many characters of it are not in the tokenizer's segment
# cache: a worker-thread hop costs more than encoding them (docs/benchmarks.md, gateway profile).
INLINE_ENCODE_CHARS = 2048
INLINE_MESSAGES = 256  # more messages than this: rendered off the loop too (the template's work grows with them)
INLINE_STOP_CHARS = 1024  # stop strings longer than this in all: their automaton is built off the loop


def engine_error(e: BaseException) -> ApiError:
    """Map an engine exception to a client-visible error."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, ContextLengthExceeded):
        return ApiError("context_length", str(e), prompt_tokens=e.prompt_tokens, context_length=e.context_length,
                        prompt_tokens_at_least=e.at_least)
    if isinstance(e, ActionCacheRefused):
        return bad(str(e), e.param)
    if type(e).__name__ == "UpstreamRateLimited":  # an openai_compat endpoint still said 429 after its retries
        return ApiError("rate_limited", f"inference upstream rate limited: {e}", retry_after_s=1.0)
    if isinstance(e, UpstreamUnavailable):
        return ApiError("unavailable", f"inference upstream unavailable: {e}")
    if isinstance(e, EngineError):
        return ApiError("server_error", f"inference engine failed: {e}")
    log.exception("unexpected engine failure", exc_info=e)
    return ApiError("server_error", f"inference engine failed: {type(e).__name__}: {e}")


class ClientGone(BaseException):
    """The client disconnected (or stopped reading) before the call ended."""


class GatewayCore:
    def __init__(self, engine: Engine, store: SessionStore, gate: DrainGate, default_max_tokens: int = 1024) -> None:
        self.engine = engine
        self.store = store
        self.gate = gate
        self.default_max_tokens = default_max_tokens
        self.stop_ids = list(getattr(engine, "default_stop_token_ids", []) or [])
        self.prompts = PromptBuilder(engine.tokenizer, self.stop_ids)
        self.token_bytes = TokenBytes(engine.tokenizer)  # what logprobs show per token

    async def start(self, req: ChatRequest, session_id: str, inline: bool = False) -> Call:
        """Admit and prepare a call; ``inline``: its prompt may be built on the event loop when cheap."""
        most = int(getattr(self.engine, "max_top_logprobs", 0) or 0)
        if req.top_logprobs > most:
            raise bad(f"'top_logprobs' is {req.top_logprobs} but this engine ({type(self.engine).__name__}) "
                      + (f"reports at most {most} alternatives per token" if most else "cannot report alternatives")
                      + "; ask for fewer, or leave top_logprobs out", "top_logprobs")
        text_level = bool(getattr(self.engine, "text_level", False))
        if req.tools and req.tool_choice != "none" and not text_level:  # a chat endpoint renders tools itself
            refusal = tools_refusal(self.engine)
            if refusal is not None:
                raise bad(refusal, "tools")
        unwritable = self.store.writable()  # never acknowledge a call whose record cannot be written
        if unwritable is not None:
            raise ApiError("unavailable", f"{unwritable}; calls are refused until the gateway can record them "
                           "again (free space on the records' filesystem; GET /health says when)")
        await self.gate.enter()
        try:
            call = (TextCall if text_level else Call)(self, req, session_id, inline)
        except BaseException:
            self.gate.exit()  # nothing was started: the slot is free again
            raise
        try:
            await call.prepare()
        except BaseException as e:
            await call.close(e)
            if isinstance(e, Exception):
                raise engine_error(e) from None
            raise
        return call

    async def finish(self, call: Call) -> CallOutput:
        """Drain a started call; an engine failure mid-generation becomes an ``ApiError``."""
        out = None
        try:
            async for ev in call.events():
                if isinstance(ev, CallOutput):
                    out = ev
        except Exception as e:
            raise engine_error(e) from None
        assert out is not None
        if out.finish == "abort":
            raise ApiError("unavailable", "the inference engine aborted the request (shutting down or weights swapping); retry")
        return out


class Call:
    def __init__(self, core: GatewayCore, req: ChatRequest, session_id: str, inline: bool = False) -> None:
        self.core = core
        self.inline = inline
        self.req = req
        self.session_id = session_id
        self.tools = [] if req.tool_choice == "none" else req.tools
        self.started_at = time.time()
        self._t0 = time.perf_counter()
        self.first_token_s: float | None = None
        self.call_index = core.store.next_call_index(session_id)
        self.policy_version = int(getattr(core.engine, "policy_version", 0))
        self.prompt: Prompt | None = None  # set once the engine accepted it
        self.sent: GenerationRequest | None = None  # what the engine sampled with (a run may override the ask)
        self.rejected_prompt: dict[str, Any] | None = None  # count and hash of a prompt refused before generation
        self.sampled: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []  # of each sampled token: the weights that sampled it
        self.top_logprobs: list[list[tuple[int, float]]] | None = [] if req.top_logprobs else None
        self.output: CallOutput | None = None
        self.parsed: ParsedOutput | None = None
        self._gen: Any = None
        self._first: TokenEvent | None = None
        self._whole: GenerationResult | None = None  # the engine's whole answer, when it gave it in one piece
        self._text_stream: TextStream | None = None  # built with the prompt, off the event loop
        self._recorded = False
        self._closed = False

    async def prepare(self) -> None:
        core = self.core
        self.prompt, greq = await self._prompt_and_request()
        self.sent = greq
        engine = core.engine
        # nothing is shown before the end (no stream, no stop string, no alternatives): the whole answer at
        # once where the engine has it in one piece. Only from an Engine itself: a wrapper that delegates
        # attributes to its engine would hand this call past its own ``generate``
        if not (greq.stream or self.req.stop or greq.top_logprobs) and isinstance(engine, Engine):
            self._whole = await engine.generate_whole(greq)
            if self._whole is not None:
                return
        self._gen = engine.generate(greq)
        try:
            self._first = await self._gen.__anext__()
        except StopAsyncIteration:
            self._first = TokenEvent(None, None, "abort")

    async def _prompt_and_request(self) -> tuple[Prompt, GenerationRequest]:
        """On the event loop when the call is small and its new text short (``INLINE_ENCODE_CHARS``), else on
        a worker thread: a prompt of megabytes takes seconds to tokenize (the tokenizer releases the GIL),
        and the event loop keeps serving meanwhile."""
        req = self.req
        if self.inline and len(req.messages) <= INLINE_MESSAGES and sum(map(len, req.stop or ())) <= INLINE_STOP_CHARS:
            try:
                return self._prompt_request(INLINE_ENCODE_CHARS)
            except WouldBlock:  # raised before anything was tokenized: start again off the loop
                pass
        return await asyncio.to_thread(self._prompt_request)

    def _prompt_request(self, inline_chars: int | None = None) -> tuple[Prompt, GenerationRequest]:
        """Render, tokenize and check the prompt (``WouldBlock``: more than ``inline_chars`` to tokenize).
        A prompt refused here is recorded by its token count and hash, never by its ids."""
        core, req = self.core, self.req
        store, sid = core.store, self.session_id
        self._text_stream = TextStream(req.stop, parse_tools=bool(self.tools))  # its stop-string automaton
        try:
            prompt = core.prompts.build(req.messages, self.tools, lambda k: store.lookup(sid, k),
                                        getattr(core.engine, "context_length", None), inline_chars)
        except PromptTooLong as e:
            self.rejected_prompt = {"tokens": e.prompt_tokens, "tokens_at_least": True, "sha256": e.prompt_sha256}
            raise
        greq = GenerationRequest(
            prompt_ids=prompt.ids,
            max_tokens=req.max_tokens or core.default_max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            stop_token_ids=core.stop_ids,
            seed=req.seed,
            session_id=sid,
            stream=bool(req.stream),
            top_logprobs=req.top_logprobs,
        )
        try:
            greq.max_tokens = core.engine.check_prompt(greq)
        except Exception:
            self.rejected_prompt = {"tokens": len(prompt.ids), "tokens_at_least": False, "sha256": text_sha256(prompt.text)}
            raise
        return prompt, greq

    async def events(self) -> AsyncIterator[str | CallOutput]:
        """Text deltas as they become showable, then one ``CallOutput``. Records in ``finally``."""
        detok = IncrementalDetokenizer(self.core.engine.tokenizer, self.core.stop_ids)
        ts = self._text_stream or TextStream(self.req.stop, parse_tools=bool(self.tools))
        # non-streaming calls without stop strings decode once at the end instead of per token
        incremental = self.req.stream or bool(self.req.stop)
        finish = "abort"
        error: BaseException | None = None
        # the per-token loop runs for every sampled token of every call: its lists and flags are locals
        sampled, logprobs, versions, tops = self.sampled, self.logprobs, self.versions, self.top_logprobs
        version, whole = self.policy_version, self._whole
        try:
            if whole is not None:  # the whole answer at once: the same lists the events would have filled
                self.first_token_s = time.perf_counter() - self._t0 if whole.token_ids else None
                sampled.extend(whole.token_ids)
                logprobs.extend(whole.logprobs)
                versions.extend([version] * len(whole.token_ids))
                if versions and whole.policy_version is not None:
                    versions[-1] = whole.policy_version  # the last token carries the version, as its event would
                finish = whole.finish_reason
            ev, gen = (None if whole is not None else self._first), self._gen
            while ev is not None:
                token_id = ev.token_id
                if token_id is not None:
                    if self.first_token_s is None:
                        self.first_token_s = time.perf_counter() - self._t0
                    sampled.append(int(token_id))
                    logprobs.append(0.0 if ev.logprob is None else float(ev.logprob))
                    versions.append(version if ev.policy_version is None else int(ev.policy_version))
                    if tops is not None:
                        tops.append(list(ev.top_logprobs or []))
                    if incremental:
                        delta = ts.feed(detok.push(int(token_id)))
                        if delta:
                            yield delta
                        if ts.stop_hit is not None:
                            finish = "stop_sequence"
                            break
                if ev.finish_reason is not None:
                    finish = ev.finish_reason
                    break
                try:
                    ev = await gen.__anext__()
                except StopAsyncIteration:
                    ev = None
            if not incremental:
                skip = detok.skip
                detok.ids.extend([t for t in sampled if t not in skip])
            if finish != "stop_sequence":
                delta = ts.feed(detok.flush())
                if ts.stop_hit is not None:
                    finish = "stop_sequence"
                if delta:
                    yield delta
            delta = ts.finish()
            if delta:
                yield delta
            self.output = self._output(ts, finish)
            yield self.output
        except BaseException as e:  # engine error mid-stream, or the client went away (cancellation)
            error = e
            raise
        finally:
            await self.close(error)

    async def close(self, error: BaseException | None = None) -> None:
        """End the call once: stop the engine stream, write the record, leave the drain gate.

        The server calls this when a streaming response ends for any reason, so a client that hangs up
        (or never reads) still leaves an incomplete record and frees its slot."""
        if self._closed:
            return
        self._closed = True
        if error is None and self.output is None:
            error = ClientGone()
        try:
            await self._close_gen()
        finally:
            self.finish_record(error=error)
            self.core.gate.exit()

    def _output(self, ts: TextStream, finish: str) -> CallOutput:
        text = ts.text
        parsed = parse_hermes(text) if self.tools else ParsedOutput(text, [])
        self.parsed = parsed
        if finish == "stop" and parsed.tool_calls:
            finish = "tool_calls"
        return CallOutput(
            text=text,
            content=parsed.content,
            tool_calls=parsed.tool_calls,
            finish=finish,
            stop_sequence=ts.stop_hit,
            prompt_tokens=len(self.prompt.ids) if self.prompt else 0,
            sampled_ids=self.sampled,
            logprobs=self.logprobs,
            top_logprobs=self.top_logprobs,
            call_index=self.call_index,
            tool_parse_error=parsed.parse_error,
        )

    def extra_metadata(self) -> dict[str, Any]:
        """What a kind of call adds to its record's metadata (a text-level call: the endpoint's answer)."""
        return {}

    async def _close_gen(self) -> None:
        if self._gen is not None:
            gen, self._gen = self._gen, None
            try:
                await gen.aclose()
            except Exception:  # the engine already failed; the record carries the error
                log.debug("engine generator close failed", exc_info=True)

    def output_message(self) -> dict[str, Any]:
        out = self.output
        msg: dict[str, Any] = {"role": "assistant", "content": out.content if out else ""}
        if out and out.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in out.tool_calls
            ]
        return msg

    def finish_record(self, error: BaseException | None = None) -> None:
        """Record this call once: complete only when it ended normally with token data.

        The record is built after the response has gone out, or earlier the moment anything reads the
        session: ``SessionStore.defer`` keeps that order."""
        if self._recorded:
            return
        self._recorded = True
        ended_at, total_s = time.time(), time.perf_counter() - self._t0
        self.core.store.defer(lambda: self._record(error, ended_at, total_s))

    def _record(self, error: BaseException | None, ended_at: float, total_s: float) -> CallRecord:
        out = self.output
        err_text = None
        if error is not None:
            err_text = "client disconnected before the call ended" if not isinstance(error, Exception) else (
                getattr(error, "message", None) or f"{type(error).__name__}: {error}"
            )
        elif out is not None and out.finish == "abort":
            err_text = "engine aborted the request"
        finish = out.finish if out is not None else ("abort" if error is not None else "error")
        msg = self.output_message()
        meta: dict[str, Any] = {
            "output": msg,
            "prompt_reuse": self.prompt.reuse if self.prompt else {},
            "chat_template": getattr(self.core.engine, "chat_template_source", None) or "model",
            "logprob_mode": getattr(self.core.engine, "logprob_mode", "raw_logprobs"),
            "timings": {
                "ttft_s": self.first_token_s,
                "total_s": total_s,
            },
            "sampling": {
                "temperature": self.sent.temperature if self.sent else self.req.temperature,
                "top_p": self.req.top_p,
                "max_tokens": self.sent.max_tokens if self.sent else self.req.max_tokens,
                "stop": self.req.stop,
                "seed": self.req.seed,
                "requested": {"temperature": self.req.temperature, "max_tokens": self.req.max_tokens},
            },
        }
        if self.rejected_prompt is not None:
            meta["rejected_prompt"] = self.rejected_prompt
        meta.update(self.extra_metadata())
        if out is not None and out.stop_sequence:
            meta["stop_sequence"] = out.stop_sequence
        if out is not None and out.tool_parse_error:
            meta["tool_parse_error"] = out.tool_parse_error
        complete = error is None and out is not None and out.finish != "abort"
        if complete and self.prompt is not None:
            meta["reuse_key"] = reuse_key(self.prompt.prefix_hashes[-1], msg).hex()
        rec = CallRecord(
            session_id=self.session_id,
            call_index=self.call_index,
            provider=self.req.provider,
            model=self.req.model,
            messages=self.req.messages,
            prompt_ids=list(self.prompt.ids) if self.prompt else [],
            sampled_ids=list(self.sampled),
            logprobs=list(self.logprobs),
            finish_reason=finish,
            # the oldest weights any of its tokens came from; per token only when they differ (a weight
            # update in flight, gateway.sync.in_flight: continue)
            policy_version=min(self.versions, default=self.policy_version),
            sampled_versions=list(self.versions) if len(set(self.versions)) > 1 else [],
            started_at=self.started_at,
            ended_at=ended_at,
            error=err_text,
            complete=complete,
            tools=self.tools,
            metadata=meta,
        )
        return rec


class TextCall(Call):
    """A call to a text-level engine (``engine: openai_compat``): the messages, tools and sampling go to the
    endpoint as they are; text and tool calls come back.

    The prompt is still rendered and checked with the engine's local tokenizer, so the record has ids: the
    endpoint's own (prompt and sampled ids, with logprobs) when it returned both, else the local rendering
    and the answer re-encoded in the local tokenizer (its Hermes form, then the end-of-turn id), with no
    logprobs (``metadata.logprob_mode: none``, ``metadata.token_source: retokenized``)."""

    result: Any = None

    async def prepare(self) -> None:
        core, req = self.core, self.req
        engine: Any = core.engine
        if req.logprobs and not getattr(engine.config, "token_ids", False):
            raise bad(f"'logprobs' needs token logprobs from the endpoint, and this gateway's openai_compat engine "
                      f"does not ask for them ({engine.config.config_key}.engine_kwargs.token_ids: false); "
                      "leave logprobs out, or serve a vLLM endpoint with token_ids: true", "logprobs")
        self.prompt, greq = await self._prompt_and_request()
        self.sent = greq
        body = engine.body(req.messages, self.tools, req.tool_choice, req.max_tokens, req.temperature, req.top_p,
                           req.stop, req.seed, bool(req.stream))
        self._gen = engine.chat(body)
        try:
            self._first = await self._gen.__anext__()
        except StopAsyncIteration:
            self._first = None

    async def events(self) -> AsyncIterator[str | CallOutput]:  # type: ignore[override]
        error: BaseException | None = None
        try:
            item: Any = self._first
            while item is not None:
                if isinstance(item, str):
                    if self.first_token_s is None:
                        self.first_token_s = time.perf_counter() - self._t0
                    yield item
                else:
                    self.result = item
                    break
                try:
                    item = await self._gen.__anext__()
                except StopAsyncIteration:
                    item = None
            if self.result is None:
                raise EngineError("the endpoint ended its answer without a finish reason")
            self.output = self._text_output(self.result)
            yield self.output
        except BaseException as e:
            error = e
            raise
        finally:
            await self.close(error)

    def _text_output(self, res: Any) -> CallOutput:
        from polar.gateway.normalized import parse_arguments
        from polar.gateway.toolcalls import ToolCall

        calls = [ToolCall(c["name"], parse_arguments(c["arguments"]), **({"id": c["id"]} if c["id"] else {}))
                 for c in res.tool_calls]
        finish = "tool_calls" if calls and res.finish_reason in ("stop", "tool_calls") else res.finish_reason
        if finish == "tool_calls" and not calls:
            finish = "stop"
        tok = self.core.engine.tokenizer
        blocks = [f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.arguments}, ensure_ascii=False)}\n"
                  "</tool_call>" for c in calls]
        hermes = "\n".join([res.content, *blocks] if res.content else blocks)
        self.token_source = "retokenized"
        n_ids = res.sampled_ids
        if res.prompt_ids and n_ids and res.logprobs is not None and len(res.logprobs) == len(n_ids):
            self.token_source = "endpoint"
            if self.prompt is not None:  # the ids the endpoint consumed, not polar's local rendering
                self.prompt = dataclasses.replace(self.prompt, ids=[int(t) for t in res.prompt_ids])
            self.sampled = [int(t) for t in n_ids]
            self.logprobs = list(res.logprobs)
        else:
            ids = list(tok.encode(hermes, add_special_tokens=False)) if hermes else []
            if finish in ("stop", "tool_calls") and self.core.stop_ids:
                ids.append(self.core.stop_ids[0])  # the turn ended: the end-of-turn id, as a sampled stop
            self.sampled = ids
            self.logprobs = [0.0] * len(ids)
        self.parsed = ParsedOutput(res.content, calls)
        prompt_tokens = len(self.prompt.ids) if self.prompt else 0
        return CallOutput(text=hermes, content=res.content, tool_calls=calls, finish=finish, stop_sequence=None,
                          prompt_tokens=res.prompt_tokens if res.prompt_tokens is not None else prompt_tokens,
                          sampled_ids=self.sampled, logprobs=self.logprobs, call_index=self.call_index,
                          completion_tokens_reported=res.completion_tokens, logprob_content=res.logprob_content)

    def extra_metadata(self) -> dict[str, Any]:
        engine: Any = self.core.engine
        res = self.result
        meta: dict[str, Any] = {
            "endpoint": {"base_url": engine.base_url, "model": engine.config.model,
                         "retries": res.retries if res is not None else None},
            "token_source": getattr(self, "token_source", None),
            "logprob_mode": "endpoint" if getattr(self, "token_source", None) == "endpoint" else "none",
        }
        if res is not None:
            meta["endpoint"]["usage"] = {"prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens}
            if getattr(self, "token_source", None) != "endpoint" and res.logprobs:
                meta["endpoint_logprobs"] = res.logprobs  # the endpoint's, for tokens polar has no ids of
        return meta
