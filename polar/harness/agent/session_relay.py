"""A per-session HTTP relay to the gateway that lets through only that session's model calls.

Everything a harness runs is untrusted: the CLI, the agent program and the code it writes. The relay is the
harness's only address for the gateway (the sandbox's Unix socket, or a loopback port for a ``command``
harness), so it parses each request (HTTP/1.1 with :mod:`h11`: keep-alive, pipelining, chunked bodies,
streamed SSE answers) and forwards only:

- ``POST /s/<its session>/`` + a model-call path the gateway serves (``v1/chat/completions``,
  ``v1/responses``, ``v1/messages``, ``v1/messages/count_tokens``, ``<v1|v1beta|v1alpha>/models/<model>:<method>``);
- ``GET /s/<its session>/v1/models`` and ``.../v1/models/<model>`` (model discovery; read-only, no session data).

Anything else (``/admin/*``, ``/sessions``, another session's prefix, a path with no prefix, an absolute or
``..`` target) gets a 403 or 404 from the relay itself and never reaches the gateway. The gateway checks
the session's key and its admin token as well: the relay is the first of two locks, not the only one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from urllib.parse import unquote_to_bytes, urlsplit

import h11
import orjson

from polar.errors import HarnessError

log = logging.getLogger(__name__)

CHUNK_BYTES = 65536
CONNECT_TIMEOUT_S = 10.0
MAX_HEADER_BYTES = 64 * 1024
MAX_CONNECTIONS = 64  # open harness connections per session: more get a 503 (each may hold one gateway connection)
IDLE_TIMEOUT_S = 60.0  # for a request's head, from its connection's start or its previous answer (as uvicorn's keep-alive)
#: Model-call routes under ``/s/<session>``: (method, full match of the decoded path after the prefix).
ALLOWED_ROUTES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("POST", re.compile(r"/v1/(chat/completions|responses|messages|messages/count_tokens)")),
    ("POST", re.compile(r"/(v1|v1beta|v1alpha)/models/[^/]+")),
    ("GET", re.compile(r"/v1/models(/[^/]+)?")),
)
#: Hop-by-hop headers (RFC 9110 §7.6.1) and polar's own control headers: never passed on.
DROPPED = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"te", b"trailer",
                     b"transfer-encoding", b"upgrade", b"expect", b"x-polar-admin-token", b"x-polar-session"})


def route_refusal(method: bytes, target: bytes, session_id: str) -> tuple[int, str] | None:
    """``(status, why)`` when a request for ``target`` is not one of session ``session_id``'s model calls."""
    if not target.startswith(b"/s/"):
        return 403, f"only /s/{session_id}/ model calls pass this relay; {target[:80].decode('latin-1')!r} is not one"
    path = target.split(b"?", 1)[0]
    sid_raw, sep, rest = path[3:].partition(b"/")
    sid = unquote_to_bytes(sid_raw).decode("utf-8", "replace")
    if sid != session_id or not sep:
        return 403, f"this relay serves session {session_id!r} only (/s/{session_id}/...)"
    decoded = "/" + unquote_to_bytes(rest).decode("utf-8", "replace")
    name = method.decode("latin-1")
    for allowed, pattern in ALLOWED_ROUTES:
        if name == allowed and pattern.fullmatch(decoded) and "/../" not in decoded + "/" and "/./" not in decoded + "/":
            return None
    return 404, (f"{name} {decoded} is not a model call; this relay passes POST /v1/chat/completions, /v1/responses, "
                 "/v1/messages, /v1/messages/count_tokens, /v1beta/models/<model>:<method> and GET /v1/models")


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    """The connection's next h11 event, reading from ``reader`` as needed (EOF becomes ConnectionClosed)."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await reader.read(CHUNK_BYTES))


def _error_bytes(conn: h11.Connection, status: int, message: str) -> bytes:
    kind = {400: "invalid_request_error", 403: "permission_error", 404: "not_found_error"}.get(status, "api_error")
    body = orjson.dumps({"error": {"message": message, "type": kind, "code": None, "param": None}})
    headers = [("content-type", "application/json"), ("content-length", str(len(body))), ("connection", "close")]
    return b"".join([conn.send(h11.Response(status_code=status, headers=headers)) or b"",
                     conn.send(h11.Data(data=body)) or b"", conn.send(h11.EndOfMessage()) or b""])


class SessionRelay:
    """Relays one session's model calls from its harness to the gateway at ``gateway_url`` (http only)."""

    def __init__(self, gateway_url: str, session_id: str) -> None:
        parts = urlsplit(gateway_url)
        if parts.scheme != "http" or not parts.hostname:
            raise HarnessError(
                f"the session relay speaks plain HTTP, but the gateway URL is {gateway_url!r}; "
                "use an http:// gateway address or set sandbox.network: host"
            )
        if not session_id:
            raise HarnessError("the session relay needs the session id it serves")
        self.target = (parts.hostname, parts.port or 80)
        self.session_id = session_id
        self.refused = 0  # requests refused so far (for logs and tests)
        self.connections = 0  # harness connections open now
        self._handlers: set[asyncio.Task[None]] = set()
        self._servers: list[asyncio.Server] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One harness connection: requests one after another (keep-alive, pipelined ones wait their turn)."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.connections += 1
        me = asyncio.current_task()
        if me is not None:
            self._handlers.add(me)
        try:
            if self.connections > MAX_CONNECTIONS:
                body = orjson.dumps({"error": {"message": f"more than {MAX_CONNECTIONS} connections open to the gateway "
                                               "relay of this session; close some, or reuse them (keep-alive)",
                                               "type": "overloaded_error", "code": None, "param": None}})
                writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                             b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                return
            while True:
                try:
                    event = await asyncio.wait_for(_next_event(conn, reader), IDLE_TIMEOUT_S)
                except asyncio.TimeoutError:
                    return  # idle (or a request head trickling in): close, as the gateway does
                except h11.RemoteProtocolError as e:
                    if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                        writer.write(_error_bytes(conn, e.error_status_hint, f"malformed HTTP request: {e}"))
                    return
                if not isinstance(event, h11.Request):
                    return  # ConnectionClosed (or anything unexpected): done with this connection
                refusal = route_refusal(event.method, event.target, self.session_id)
                if refusal is not None:
                    self.refused += 1
                    log.info("session relay %s refused %s %r", self.session_id, event.method.decode("latin-1"),
                             event.target[:200])
                    writer.write(_error_bytes(conn, *refusal))
                    return
                if not await self._exchange(event, conn, reader, writer):
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (ConnectionError, OSError, h11.LocalProtocolError):
            pass
        finally:
            self.connections -= 1
            if me is not None:
                self._handlers.discard(me)
            with contextlib.suppress(Exception):
                await writer.drain()
            with contextlib.suppress(Exception):
                writer.close()

    async def _exchange(self, request: h11.Request, conn: h11.Connection, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> bool:
        """Forward one request and its answer; False when the connection cannot carry another request."""
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*self.target), CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as e:
            writer.write(_error_bytes(conn, 502, f"the gateway is unreachable: {type(e).__name__}: {e}"))
            return False
        up = h11.Connection(h11.CLIENT)
        chunked = any(k.lower() == b"transfer-encoding" for k, _ in request.headers)
        headers = [(k, v) for k, v in request.headers
                   if k.lower() not in DROPPED and not (chunked and k.lower() == b"content-length")]
        if chunked:
            headers.append((b"transfer-encoding", b"chunked"))  # h11 re-frames the body it is given
        headers.append((b"connection", b"close"))
        hung_up, uploaded = asyncio.Event(), asyncio.Event()
        try:
            up_w.write(up.send(h11.Request(method=request.method, target=request.target, headers=headers)) or b"")
            if conn.they_are_waiting_for_100_continue:
                writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
            client = asyncio.ensure_future(self._from_client(conn, reader, up, up_w, hung_up, uploaded))
            try:
                answered = await self._to_client(conn, writer, up, up_r, hung_up)
                # another request may follow only when this one was read to its end and the client stays
                return answered and uploaded.is_set() and not hung_up.is_set()
            finally:
                client.cancel()
                with contextlib.suppress(BaseException):
                    await client
        except h11.RemoteProtocolError as e:  # the gateway's answer did not parse
            if conn.our_state is h11.SEND_RESPONSE:
                writer.write(_error_bytes(conn, 502, f"bad answer from the gateway: {e}"))
            return False
        finally:
            with contextlib.suppress(Exception):
                up_w.close()

    async def _from_client(self, conn: h11.Connection, reader: asyncio.StreamReader, up: h11.Connection,
                           up_w: asyncio.StreamWriter, hung_up: asyncio.Event, uploaded: asyncio.Event) -> None:
        """Pass the request body on; then keep reading the client (pipelined bytes wait in ``conn``) to
        notice a hang-up, which cancels the call at the gateway (it closes the upstream connection)."""
        while True:
            try:
                event = await _next_event(conn, reader)
            except (h11.RemoteProtocolError, ConnectionError, OSError):  # e.g. closed before its body was complete
                hung_up.set()
                return
            if isinstance(event, h11.Data):
                try:
                    up_w.write(up.send(h11.Data(data=event.data)) or b"")
                    await up_w.drain()
                except (ConnectionError, OSError):
                    return  # the gateway stopped reading (it answered early, e.g. 413): its answer still goes back
            elif isinstance(event, h11.EndOfMessage):
                try:
                    up_w.write(up.send(h11.EndOfMessage()) or b"")
                    await up_w.drain()
                except (ConnectionError, OSError):
                    return
                uploaded.set()
                break
            else:  # ConnectionClosed mid-body
                hung_up.set()
                return
        while True:
            try:
                data = await reader.read(CHUNK_BYTES)
            except (ConnectionError, OSError):
                data = b""
            conn.receive_data(data)
            if not data:
                hung_up.set()
                return

    async def _to_client(self, conn: h11.Connection, writer: asyncio.StreamWriter, up: h11.Connection,
                         up_r: asyncio.StreamReader, hung_up: asyncio.Event) -> bool:
        """Pass the gateway's answer back as it comes (SSE events are flushed one by one)."""
        while True:
            waiter = asyncio.ensure_future(_next_event(up, up_r))
            stop = asyncio.ensure_future(hung_up.wait())
            try:
                await asyncio.wait((waiter, stop), return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
            if not waiter.done():  # the client hung up: drop the upstream call (the gateway cancels it)
                waiter.cancel()
                with contextlib.suppress(BaseException):
                    await waiter
                return False
            event = waiter.result()
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                headers = [(k, v) for k, v in event.headers if k.lower() not in DROPPED]
                writer.write(conn.send(h11.Response(status_code=event.status_code, headers=headers,
                                                    reason=event.reason)) or b"")
            elif isinstance(event, h11.Data):
                writer.write(conn.send(h11.Data(data=event.data)) or b"")
                await writer.drain()
            elif isinstance(event, h11.EndOfMessage):
                writer.write(conn.send(h11.EndOfMessage()) or b"")
                await writer.drain()
                return True
            else:  # the gateway closed mid-answer
                if conn.our_state is h11.SEND_RESPONSE:
                    writer.write(_error_bytes(conn, 502, "the gateway closed the connection before answering"))
                return False

    async def listen_tcp(self, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
        """Serve on ``host:port`` on the running loop (``port`` 0: a free one); :meth:`aclose` stops it."""
        server = await asyncio.start_server(self.serve, host, port, limit=CHUNK_BYTES)
        self._servers.append(server)
        return server

    async def listen_unix(self, path: str) -> asyncio.Server:
        server = await asyncio.start_unix_server(self.serve, path, limit=CHUNK_BYTES)
        self._servers.append(server)
        return server

    async def aclose(self) -> None:
        """Stop listening and end every open connection (a call under way is dropped: the gateway cancels it)."""
        for server in self._servers:
            server.close()
        self._servers.clear()
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

