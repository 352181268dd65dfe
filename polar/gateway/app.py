"""The gateway's ASGI app: routing, sessions, body limits, provider errors, admin and session reads.

Request flow: ``SessionPrefix`` strips ``/s/{session_id}`` off the path; the provider route reads the
body (bounded), parses it into a ``ChatRequest``, checks the model name, and hands it to
``GatewayCore``. Every failure becomes that provider's error shape with the right status; nothing a
client sends can crash the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import math
import socket
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import unquote_to_bytes

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from polar.gateway.core import GatewayCore, engine_error
from polar.gateway.drain import DrainGate, retry_after_header
from polar.gateway.errors import ApiError, bad
from polar.gateway.providers import anthropic, gemini, openai_chat, openai_responses, schemas
from polar.gateway.sessions import SessionStore, key_hash, key_session_id, session_id_problem
from polar.inference.action_cache import ActionCacheEngine
from polar.types import SESSION_KEY_PREFIX

log = logging.getLogger(__name__)

SESSION_HEADER = "x-polar-session"
ADMIN_HEADER = "x-polar-admin-token"
DEFAULT_SESSION = "default"
HEALTH_TIMEOUT_S = 10.0  # the most /health waits for the engine's own report


class SessionPrefix:
    """ASGI wrapper: ``/s/{session_id}/rest`` -> ``/rest`` with the id kept in the scope.

    ``POST`` to an exact model-call path (``fast_routes``) goes straight to its endpoint; everything
    else goes through the Starlette router. The endpoints catch every exception themselves, so the
    short path loses none of the router's error handling and saves its per-request cost."""

    def __init__(self, app: Any, fast_routes: dict[str, Callable[[Request], Awaitable[Response]]] | None = None,
                 responding: Callable[[], contextlib.AbstractContextManager[None]] | None = None) -> None:
        self.app = app
        self.fast_routes = fast_routes or {}
        self.responding = responding or contextlib.nullcontext  # records wait until the response went out

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            with self.responding():
                await self._http(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path: str = scope["path"]
        if path.startswith("/s/"):
            # split the raw path, so an encoded '/' (%2F) stays inside the session id
            raw: bytes = scope.get("raw_path") or path.encode()
            sid_raw, sep, rest_raw = raw[3:].partition(b"/") if raw.startswith(b"/s/") else (b"", b"", b"")
            sid = _unquote(sid_raw)
            if sid:
                scope = dict(scope)
                scope["path"] = path = "/" + _unquote(rest_raw) if sep else "/"
                scope["raw_path"] = b"/" + rest_raw if sep else b"/"
                scope["polar_session"] = sid
        endpoint = self.fast_routes.get(path) if scope["method"] == "POST" else None
        if endpoint is not None:
            scope.setdefault("app", self.app)
            scope.setdefault("path_params", {})
            response = await endpoint(Request(scope, receive))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


_KEY_HEADERS = (b"authorization", b"x-api-key", b"x-goog-api-key")


def api_key(request: Request) -> str | None:
    """``Authorization: Bearer``, else ``x-api-key``, else ``x-goog-api-key`` (the first of each header), else
    ``?key=``. One pass over the raw headers: this runs on every model call."""
    found: dict[bytes, bytes] = {}
    for name, value in request.scope["headers"]:
        if name in _KEY_HEADERS and name not in found:
            found[name] = value
    auth = found.get(b"authorization")
    if auth:
        text = auth.decode("latin-1")
        if text.lower().startswith("bearer "):
            return text[7:].strip() or None
    key = found.get(b"x-api-key") or found.get(b"x-goog-api-key")
    if key:
        return key.decode("latin-1")
    return request.query_params.get("key") if request.scope.get("query_string") else None


def _unquote(raw: bytes) -> str:
    return unquote_to_bytes(raw).decode("utf-8", "replace")


def session_of(request: Request) -> str:
    """URL prefix, then the ``x-polar-session`` header, then the API key (by its hash: keys never reach disk)."""
    given, source = request.scope.get("polar_session"), "the /s/{session_id} URL prefix"
    if not given:
        given, source = request.headers.get(SESSION_HEADER), f"the '{SESSION_HEADER}' header"
    if not given:
        key = api_key(request)
        if not key:
            return DEFAULT_SESSION
        given, source = key_session_id(key), f"the API key ({SESSION_KEY_PREFIX}<session id>)"
    problem = session_id_problem(given)  # checked before the call is admitted: ids reach headers and files
    if problem is not None:
        raise bad(f"{problem} (from {source}); e.g. /s/run1-task7/v1", "session_id")
    return given


def caller_of(request: Request) -> str | None:
    """The caller's identity for session ownership: its API key's hash (``None`` without a key)."""
    key = api_key(request)
    return key_hash(key) if key else None


async def until_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Run ``work`` unless the client hangs up first; then cancel it and return ``None``.

    A non-streaming call has no body being sent to notice a disconnect by, so a watcher task listens for
    the ASGI ``http.disconnect`` message (the request body has been read by now) and cancels the call:
    the engine stops generating for nobody, and the call's record says ``complete=false``. ``work`` runs
    in the request's own task, which the watcher cancels: one task per call, not two and an
    ``asyncio.wait`` (this runs on every model call)."""
    task = asyncio.current_task()
    assert task is not None  # an ASGI app always runs in a task
    gone = False

    async def hung_up() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.ensure_future(hung_up())
    try:
        result = await work
    except asyncio.CancelledError:
        if gone and task.uncancel() == 0:  # the watcher's cancellation, and nobody else's: the client left
            return None
        raise
    finally:
        watcher.cancel()
    if gone:  # the work ended despite the watcher's cancellation: take it back, the answer stands
        task.uncancel()
    return result


class SSEResponse(Response):
    """Server-sent events that stop as soon as the client disconnects.

    A disconnect cancels the stream (so the engine stops generating for nobody) and ``on_close`` always
    runs, even when the body was never started, so the call is recorded and leaves the drain gate."""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], headers: dict[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", **headers})  # no body yet: no content-length
        self.body_iterator = body
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def listen() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        async def stream() -> None:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            # the call ends (its record is in the store) before the client sees the stream end, so a client
            # that reads the session right after its stream always finds this call (an aborted one included)
            await self.on_close()
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            async with anyio.create_task_group() as tg:

                async def run(fn: Callable[[], Awaitable[None]]) -> None:
                    await fn()
                    tg.cancel_scope.cancel()

                tg.start_soon(run, stream)
                await run(listen)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
                await self.on_close()


class GatewayApp:
    """Holds the engine, the session store and the drain gate; ``asgi`` is what uvicorn serves."""

    def __init__(self, engine: Any, config: Any, records_dir: Any) -> None:
        self.engine = engine
        self.config = config
        self.store = SessionStore(records_dir, fsync=config.fsync, resume=config.resume_records)
        self.gate = DrainGate(config.pause_mode, config.pause_wait_s, config.retry_after_s)
        self.core = GatewayCore(engine, self.store, self.gate, config.default_max_tokens)
        if config.sync.in_flight == "continue" and not getattr(engine, "continues_in_flight", False):
            from polar.errors import ConfigError

            raise ConfigError(f"gateway.sync.in_flight: continue keeps generations going across a weight update, and "
                              f"the {type(engine).__name__} cannot (the embedded engine can); use finish or abort")
        if hasattr(engine, "configure_sync"):  # upstream engines: where synced weights go, how they are checked
            from pathlib import Path

            engine.configure_sync(config.sync, Path(records_dir).parent / "weight_sync" if records_dir else None)
        self.model_names = [engine.model_name, *[a for a in config.model_aliases if a != engine.model_name]]
        self._swap_lock: asyncio.Lock | None = None
        self._known_tools: OrderedDict[bytes, None] = OrderedDict()  # tool lists that passed validation
        fast_routes = {
            "/v1/chat/completions": self._provider(openai_chat),
            "/v1/responses": self._provider(openai_responses),
            "/v1/messages": self._provider(anthropic),
        }
        routes = [
            *(Route(path, endpoint, methods=["POST"]) for path, endpoint in fast_routes.items()),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
            Route("/{version:str}/models/{target:str}", self._provider(gemini), methods=["POST"]),
            Route("/v1/models", self.list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.get_model, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/sessions", self.list_sessions, methods=["GET"]),
            Route("/sessions/{session_path:path}", self.read_session, methods=["GET"]),  # ids may hold '/'
            Route("/admin/status", self.admin_status, methods=["GET"]),
            Route("/admin/pause", self.admin_pause, methods=["POST"]),
            Route("/admin/resume", self.admin_resume, methods=["POST"]),
            Route("/admin/weights", self.admin_weights, methods=["POST"]),
            Route("/admin/claim", self.admin_claim, methods=["POST"]),
        ]
        self.starlette = Starlette(routes=routes, exception_handlers={404: self._no_route, 405: self._no_route})
        self.asgi: Any = HostOriginGuard(SessionPrefix(self.starlette, fast_routes, self.store.responding),
                                         allowed_host_names(config))

    # ---- helpers -------------------------------------------------------------------------------

    async def _no_route(self, request: Request, exc: Exception) -> Response:
        path = request.url.path
        if getattr(exc, "status_code", 404) == 405:
            allowed = (getattr(exc, "headers", None) or {}).get("Allow", "another method")
            err = ApiError("method_not_allowed", f"{request.method} is not allowed on {path}; use {allowed}")
        else:
            err = ApiError("not_found", f"no route for {request.method} {path}; model calls go to "
                           "/v1/chat/completions, /v1/responses, /v1/messages or /v1beta/models/{model}:generateContent")
        body = gemini.error_body(err) if "/models/" in path else openai_chat.error_body(err)
        return self._json(body, err.status)

    def _json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
        return Response(orjson.dumps(obj), status, headers=headers, media_type="application/json")

    def _error(self, provider: Any, err: ApiError) -> Response:
        headers = {"retry-after": retry_after_header(err.retry_after_s)} if err.kind == "rate_limited" else None
        return self._json(provider.error_body(err), err.status, headers)

    async def _read(self, request: Request) -> bytes:
        """The body, refused (413) as soon as it passes ``max_body_bytes``, declared or streamed."""
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ApiError("too_large", f"request body is {declared} bytes; the limit is {limit} (gateway.max_body_bytes)")
        chunks, size = [], 0
        receive = request.receive
        try:
            async with asyncio.timeout(BODY_TIMEOUT_S):  # a body dripped slowly must not hold its connection
                while True:  # the ASGI messages themselves: Request.stream() adds an async generator per call
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise ClientDisconnect()
                    if message["type"] != "http.request":
                        continue
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise ApiError("too_large", f"request body exceeds {limit} bytes (gateway.max_body_bytes)")
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise ApiError("timeout", f"the request body did not arrive within {BODY_TIMEOUT_S:g} s ({size} bytes "
                           "read); send it at once") from None
        return b"".join(chunks)

    async def _body(self, request: Request) -> dict[str, Any]:
        raw = await self._read(request)
        if len(raw) > INLINE_PARSE_BYTES:  # a big body is parsed on a worker thread: the loop keeps serving
            return await asyncio.to_thread(_parse_json, raw, request)
        return _parse_json(raw, request)

    def check_model(self, name: str) -> None:
        if self.config.accept_any_model or name in self.model_names:
            return
        raise ApiError(
            "not_found",
            f"model {name!r} is not served here; use one of {self.model_names} "
            "(or add it to gateway.model_aliases, or set gateway.accept_any_model)",
            param="model",
            code="model_not_found",
        )

    def _is_admin(self, request: Request) -> bool:
        token = self.config.admin_token
        if not token:
            return True
        given = request.headers.get(ADMIN_HEADER) or api_key(request) or ""
        return hmac.compare_digest(given.encode(), token.encode())

    # ---- model calls ---------------------------------------------------------------------------

    def _provider(self, provider: Any) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                raw = await self._read(request)
                req, inline = await self._parse(provider, raw, request)
                self.check_model(req.model)
                sid = session_of(request)
                self._may_append(request, sid)
                if req.stream:
                    call = await self.core.start(req, sid, inline)
                    try:  # once built, the response's own finally closes the call
                        return SSEResponse(provider.stream(req, call), call.close, {"x-polar-session": sid})
                    except BaseException as e:  # building it failed: record the call, leave the drain gate
                        await call.close(e)
                        raise
                done = await until_disconnect(request, self._call(req, sid, inline))
                if done is None:  # the client hung up: generation was cancelled, the record says so
                    return Response(status_code=499)
                call, out = done
                if self.config.fsync and self.store.write_error is not None:  # its record was written, or it fails
                    raise ApiError("unavailable", f"{self.store.write_error}; the call's record is kept in memory "
                                   "until it can be written, and its answer is withheld (gateway.fsync: true)")
                if req.logprobs or len(out.sampled_ids) > INLINE_RESPONSE_TOKENS:  # a big answer is built off the loop
                    return await asyncio.to_thread(lambda: self._json(provider.response(req, call, out)))
                return self._json(provider.response(req, call, out))
            except ApiError as e:
                return self._error(provider, e)
            except Exception as e:  # a bug must not take the server down; the client sees a 500
                log.exception("gateway request failed")
                return self._error(provider, engine_error(e))

        return endpoint

    async def _parse(self, provider: Any, raw: bytes, request: Request) -> tuple[Any, bool]:
        """The request, and whether the call is small enough to stay on the event loop.

        A body of at most ``INLINE_PARSE_BYTES`` whose tools were seen before (or that has none) is parsed
        and validated on the loop: a worker-thread hop costs more than that. Any other body goes to a worker
        thread: checking a tool schema costs ~5 us per byte the first time it is seen (jsonschema)."""
        if len(raw) > INLINE_PARSE_BYTES:
            return await asyncio.to_thread(lambda: provider.parse_request(_parse_json(raw, request), request)), False
        body = _parse_json(raw, request)
        tools = body.get("tools")
        if tools is None:
            return provider.parse_request(body, request), True
        seen = orjson.dumps(tools)
        if seen in self._known_tools:
            self._known_tools.move_to_end(seen)
            return provider.parse_request(body, request), True
        req = await asyncio.to_thread(provider.parse_request, body, request)
        self._known_tools[seen] = None  # valid: the next call with these tools is parsed on the loop
        while len(self._known_tools) > KNOWN_TOOLS_MAX:
            self._known_tools.popitem(last=False)
        return req, True

    async def _call(self, req: Any, sid: str, inline: bool = False) -> tuple[Any, Any]:
        call = await self.core.start(req, sid, inline)
        return call, await self.core.finish(call)

    async def count_tokens(self, request: Request) -> Response:
        try:
            raw = await self._read(request)
            req = await asyncio.to_thread(
                lambda: anthropic.parse_request(_parse_json(raw, request), request, count_only=True))
            tools = [] if req.tool_choice == "none" else req.tools
            prompt = await asyncio.to_thread(self.core.prompts.build, req.messages, tools, lambda key: None)
            ids = prompt.ids  # tokenized on a worker thread: a huge prompt must not hold up the event loop
            return self._json({"input_tokens": len(ids)})
        except ApiError as e:
            return self._error(anthropic, e)

    async def list_models(self, request: Request) -> Response:
        return self._json({"object": "list", "data": [self._model(n) for n in self.model_names]})

    async def get_model(self, request: Request) -> Response:
        name = request.path_params["model"]
        try:
            self.check_model(name)
        except ApiError as e:
            return self._error(openai_chat, e)
        return self._json(self._model(name))

    def _model(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": "polar",
                "context_length": self.engine.context_length}

    async def health(self, request: Request) -> Response:
        """The engine's state (each upstream replica's too) and the drain gate's counts; 503 when the
        engine cannot serve. The engine answers within its probe timeout (upstreams cache a recent probe),
        bounded here as well, so a hung upstream never hangs ``/health``."""
        try:
            engine = await asyncio.wait_for(self.engine.health(), HEALTH_TIMEOUT_S)
        except asyncio.TimeoutError:
            engine = {"state": "unavailable", "error": f"the engine did not report its state within {HEALTH_TIMEOUT_S}s"}
        except Exception as e:  # a broken engine is reported, not raised
            engine = {"state": "unavailable", "error": f"{type(e).__name__}: {e}"}
        state = engine.get("state", "unavailable")
        records_error = self.store.writable()  # a gateway that cannot record its calls cannot serve them
        if records_error is not None:
            state = "unavailable"
        body = {"status": state, "model": self.engine.model_name, "policy_version": int(self.engine.policy_version),
                **self.gate.status(), "engine": engine, "records_error": records_error}
        if isinstance(self.engine, ActionCacheEngine):  # gateway.action_cache: its hit rate and size
            body["action_cache"] = self.engine.stats()
        return self._json(body, 503 if state == "unavailable" else 200)

    # ---- session reads -------------------------------------------------------------------------

    # Ownership. The key of a session's first call owns it (the store records its hash). With
    # ``admin_token`` set: only the owner appends to a session, only the owner or the admin reads it, and
    # ``GET /sessions`` lists the caller's own sessions (the admin's: all). Without an admin token the
    # gateway is open (loopback by default): every caller is the admin.

    def _may_append(self, request: Request, session_id: str) -> None:
        caller = caller_of(request)
        if self.config.claimed_sessions_only and self.store.owner(session_id) is None:
            raise ApiError("permission", f"session {session_id!r} was not opened by this run; a harness calls only "
                           "its own session (the /s/<id>/ prefix and API key it was given)")
        owner = self.store.claim(session_id, caller)
        if self.config.admin_token and owner != caller:
            raise ApiError("permission", f"session {session_id!r} belongs to another API key; a call appends only "
                           "to a session its own key created (name a new session, or use that session's key)")

    def _readable(self, request: Request, session_id: str) -> str:
        """The id to read (a key used as the id names its key's session), once the caller may read it."""
        if not self.store.has_records(session_id) and self.store.has_records(key_session_id(session_id)):
            session_id = key_session_id(session_id)  # GET /sessions/<an API key>: the session that key names
        if not self.store.has_records(session_id):
            raise ApiError("not_found", f"session {session_id!r} has no records (GET /sessions lists them)",
                           code="session_not_found")
        if self._is_admin(request):
            return session_id
        caller = caller_of(request)
        if caller is None or self.store.owner(session_id) != caller:
            raise ApiError("permission", f"session {session_id!r} belongs to another API key; read it with the key "
                           f"that created it, or send the admin token in '{ADMIN_HEADER}'")
        return session_id

    async def list_sessions(self, request: Request) -> Response:
        if self._is_admin(request):
            return self._json({"sessions": self.store.session_ids()})
        caller = caller_of(request)
        if caller is None:
            return self._error(openai_chat, ApiError(
                "authentication", f"listing sessions needs an API key (its own sessions) or the admin token in '{ADMIN_HEADER}'"))
        return self._json({"sessions": self.store.session_ids(caller, everyone=False)})

    async def read_session(self, request: Request) -> Response:
        """``/sessions/{id}`` and ``/sessions/{id}/trajectory``; the id may hold '/' (sent as ``%2F`` or plain)."""
        raw = (request.scope.get("raw_path") or request.url.path.encode()).split(b"?", 1)[0]
        parts = raw.split(b"/sessions/", 1)[1].split(b"/")
        trajectory = len(parts) > 1 and parts[-1] == b"trajectory"
        sid = "/".join(_unquote(p) for p in (parts[:-1] if trajectory else parts))
        return await (self.get_trajectory if trajectory else self.get_session)(request, sid)

    async def get_session(self, request: Request, sid: str) -> Response:
        try:
            sid = self._readable(request, sid)
            recs = self.store.records(sid)
        except ApiError as e:
            return self._error(openai_chat, e)
        # serialized on a worker thread: a session of huge records must not hold up the event loop
        return await asyncio.to_thread(lambda: self._json({"session_id": sid, "records": [r.to_dict() for r in recs]}))

    async def get_trajectory(self, request: Request, sid: str) -> Response:
        from polar.gateway.trajectory_view import trajectory_response

        try:
            sid = self._readable(request, sid)
            recs = self.store.records(sid)
            return self._json(trajectory_response(sid, recs, request.query_params.get("builder", "per_request")))
        except ApiError as e:
            return self._error(openai_chat, e)

    # ---- admin ---------------------------------------------------------------------------------

    def _admin_denied(self, request: Request) -> Response | None:
        if self._is_admin(request):
            return None
        return self._error(openai_chat, ApiError("authentication", f"admin endpoints need the admin token in '{ADMIN_HEADER}'"))

    async def admin_status(self, request: Request) -> Response:
        return self._admin_denied(request) or self._json(
            {**self.gate.status(), "policy_version": int(self.engine.policy_version)})

    async def admin_pause(self, request: Request) -> Response:
        denied = self._admin_denied(request)
        if denied:
            return denied
        try:
            timeout_s = _timeout_param(request, 300.0)
        except ApiError as e:
            return self._error(openai_chat, e)
        return self._json(await self.gate.pause(timeout_s))

    async def admin_resume(self, request: Request) -> Response:
        return self._admin_denied(request) or self._json(self.gate.resume())

    async def admin_claim(self, request: Request) -> Response:
        """Body ``{"session_id": ..., "api_key": ...}``: give a session to a key before its harness starts, so
        no other caller (a sibling session that learnt the id) can create it first and write into it."""
        denied = self._admin_denied(request)
        if denied:
            return denied
        try:
            body = await self._body(request)
            sid, key = body.get("session_id"), body.get("api_key")
            if not isinstance(sid, str) or not sid or not isinstance(key, str) or not key:
                raise bad("body must be {\"session_id\": \"<id>\", \"api_key\": \"<the session's key>\"}", "session_id")
            problem = session_id_problem(sid)
            if problem is not None:
                raise bad(problem, "session_id")
            owner = self.store.claim(sid, key_hash(key))
            if owner != key_hash(key):
                raise ApiError("permission", f"session {sid!r} already belongs to another API key")
            return self._json({"session_id": sid, "claimed": True})
        except ApiError as e:
            return self._error(openai_chat, e)

    async def admin_weights(self, request: Request) -> Response:
        """Body ``{"path": "<file>.safetensors", "policy_version": N, "timeout_s": 300}``: drain, swap, resume."""
        denied = self._admin_denied(request)
        if denied:
            return denied
        try:
            v = schemas.validate(schemas.AdminWeightsBody, await self._body(request), request)
            path, version = v.path, v.policy_version
            if not path.endswith(".safetensors"):
                raise bad("'path' must name a .safetensors file on the gateway's machine", "path")
            from safetensors.torch import load_file

            try:
                state = await asyncio.to_thread(load_file, path)
            except (OSError, ValueError) as e:
                raise bad(f"cannot read weights from {path!r}: {e}", "path") from None
            status = await self.update_weights(state, version, v.timeout_s)
            return self._json(status)
        except ApiError as e:
            return self._error(openai_chat, e)

    async def update_weights(self, state_dict: Any, version: int, timeout_s: float = 300.0) -> dict[str, Any]:
        """Pause, wait for in-flight calls, swap, resume. Always resumes, even when the swap fails. With
        ``sync.in_flight: continue`` nothing pauses: the engine swaps between two of its steps and the calls
        under way go on under the new weights (their records say which version sampled each token)."""
        if self._swap_lock is None:
            self._swap_lock = asyncio.Lock()
        async with self._swap_lock:
            if self.config.sync.in_flight == "continue":
                try:
                    await self.engine.update_weights_in_flight(state_dict, version)
                except Exception as e:
                    raise engine_error(e) from None
                return {**self.gate.status(), "policy_version": int(self.engine.policy_version)}
            if self.config.sync.in_flight == "abort":  # end the calls under way now, rather than wait for them
                status = await self.gate.pause(0.0)
                if status["inflight"]:
                    await self.engine.abort_inflight()
            status = await self.gate.pause(timeout_s)
            try:
                if status["inflight"]:
                    raise ApiError("unavailable", f"{status['inflight']} calls still in flight after {timeout_s}s; weights not swapped")
                try:
                    await self.engine.update_weights(state_dict, version)
                except Exception as e:
                    raise engine_error(e) from None
            finally:
                self.gate.resume()
        return {**self.gate.status(), "policy_version": int(self.engine.policy_version)}


INLINE_PARSE_BYTES = 64 * 1024  # bodies above this are parsed off the event loop
KNOWN_TOOLS_MAX = 1024  # tool lists remembered as valid (model calls with them are parsed on the loop)
INLINE_RESPONSE_TOKENS = 2048  # answers longer than this (or with logprobs) are serialized off the event loop
BODY_TIMEOUT_S = 60.0  # the most a request body may take to arrive, once its headers have (docs/gateway.md, Limits)


def _parse_json(raw: bytes, request: Request) -> dict[str, Any]:
    """A request body: one JSON object, nested at most ``schemas.MAX_JSON_DEPTH`` levels; else a 400."""
    if not raw.strip():
        raise bad("request body is empty; send a JSON object")
    try:
        body = orjson.loads(raw)
    except (orjson.JSONDecodeError, ValueError) as e:
        raise bad(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad(f"request body must be a JSON object (got {type(body).__name__})")
    # every level of nesting opens with a literal '[' or '{' in the raw bytes: fewer of them than the limit
    # (the usual body) cannot nest too deep, and counting two bytes is cheaper than walking the object
    deep = raw.count(b"[") + raw.count(b"{") > schemas.MAX_JSON_DEPTH
    problem = schemas.depth_problem(body) if deep else None
    if problem is not None:
        raise bad(problem)
    request.scope[schemas.RAW_BODY_KEY] = raw  # for schemas.validate: exact big integers in its messages
    return body


HOST_CACHE_MAX = 256  # distinct Host values remembered by HostOriginGuard (a client sends one)
LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost", "ip6-loopback"})
SAFE_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS"})


def allowed_host_names(config: Any) -> frozenset[str] | None:
    """The ``Host`` names the gateway answers (IP literals always pass); ``None``: any (``allowed_hosts: ['*']``).

    A name outside this set means a DNS-rebinding page (its own domain resolved to this machine) or a
    misconfigured client; loopback names, the configured ``host`` and this machine's names pass."""
    extra = [h.lower() for h in getattr(config, "allowed_hosts", None) or []]
    if "*" in extra:
        return None
    names = set(LOOPBACK_NAMES) | set(extra)
    host = str(getattr(config, "host", "") or "").lower()
    if host and host not in ("0.0.0.0", "::"):
        names.add(host)
    else:  # all interfaces: remote clients may name this machine
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return frozenset(names)


def _host_name(value: str) -> str:
    """``example.org:8080`` -> ``example.org``; ``[::1]:80`` -> ``::1``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    return value.rpartition(":")[0] if value.count(":") == 1 else value


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostOriginGuard:
    """ASGI wrapper: refuse a ``Host`` this gateway does not go by (DNS rebinding) and, on every request
    that changes state (any method but GET/HEAD/OPTIONS), an ``Origin`` other than the gateway's own (a
    web page posting to it: CSRF). SDKs and CLIs send no ``Origin``; browsers always do on a POST."""

    def __init__(self, app: Any, hosts: frozenset[str] | None) -> None:
        self.app = app
        self.hosts = hosts
        self._host_ok: dict[str, bool] = {}  # Host header values already judged (clients send the same one)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            why = self.refusal(scope)
            if why is not None:
                body = orjson.dumps(openai_chat.error_body(ApiError("permission", why)))
                await send({"type": "http.response.start", "status": 403, "headers": [
                    (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: dict[str, Any]) -> str | None:
        host = origin = None
        for name, value in scope.get("headers") or ():
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        if host is not None and self.hosts is not None:
            ok = self._host_ok.get(host)
            if ok is None:
                name = _host_name(host)
                ok = _is_ip(name) or name in self.hosts
                if len(self._host_ok) >= HOST_CACHE_MAX:
                    self._host_ok.clear()
                self._host_ok[host] = ok
            if not ok:
                return (f"Host {host!r} is not a name of this gateway; connect by IP, localhost or the configured "
                        "host, or add the name to gateway.allowed_hosts")
        if origin is not None and scope.get("method", "GET").encode() not in SAFE_METHODS:
            if host is None or origin.lower().partition("://")[2].rstrip("/") != host.strip().lower():
                return (f"cross-origin {scope.get('method')} from {origin!r} refused: the gateway takes no "
                        "state-changing requests from web pages (send none of them with an Origin header)")
        return None


def _timeout_param(request: Request, default: float) -> float:
    """``?timeout_s=``: seconds, finite and >= 0; anything else is a 400 naming it (never a silent default)."""
    raw = request.query_params.get("timeout_s")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise bad(f"'timeout_s' must be a number of seconds >= 0 (got {raw!r}); e.g. ?timeout_s=300", "timeout_s")
    return value
