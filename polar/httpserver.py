"""Every HTTP server polar starts (the gateway, ``polar serve``, ``polar dashboard``, the rollout service, the
stand-in engines): uvicorn with the connection limits it lacks, on a socket bound before it starts, either in
the foreground or on its own thread and event loop (``ThreadedUvicorn``).

uvicorn's httptools protocol has no deadline for a request's line and headers, no cap on their size and no
cap on open connections: one client dripping headers (slowloris), sending 100 MB of headers, or holding
thousands of idle sockets would hold the server. ``GuardedHttpToolsProtocol`` adds the three
(``ConnectionLimits``); ``uvicorn_config`` wires it in with polar's defaults.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from polar.errors import PolarError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    """What one client connection may hold of a server (docs/gateway.md, Limits).

    A connection must send a request's line and headers within ``header_timeout_s`` (a slow-headers
    client is cut, however it drips); an idle keep-alive connection is closed after ``keep_alive_s``;
    request line plus headers over ``max_header_bytes`` get a 431; past ``max_connections`` open
    connections (0: three quarters of the open-file limit) the longest-idle one is closed, so idle
    sockets never exhaust the file descriptors that records and the engine need."""

    header_timeout_s: float = 10.0
    keep_alive_s: float = 30.0
    max_header_bytes: int = 64 * 1024
    max_connections: int = 0

    def connection_cap(self) -> int:
        if self.max_connections:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return max(64, (soft if soft != resource.RLIM_INFINITY else 65536) * 3 // 4)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the ``ConnectionLimits`` it lacks: a header deadline from the
    connection's (or the request's) first byte, a header size cap, and a cap on open connections that
    closes the longest-idle one. ``guarded_protocol`` makes one subclass per server (its own idle list)."""

    limits = ConnectionLimits()
    cap = 0
    server_name = "server"
    idle: OrderedDict[GuardedHttpToolsProtocol, None] = OrderedDict()  # idle since, oldest first

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()
        if len(self.connections) > self.cap:  # over the cap: the longest-idle connection makes room
            if self.idle:
                oldest, _ = self.idle.popitem(last=False)
                oldest.transport.close()
            else:  # every other connection is busy with a request: this one is refused
                transport.close()
                return
        self.idle[self] = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.idle.pop(self, None)
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timeout)

    def _cancel_head_timer(self) -> None:
        if getattr(self, "_head_timer", None) is not None:
            self._head_timer.cancel()  # type: ignore[union-attr]
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()  # no request line and headers in time: idle or a slow-headers client

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        self.idle.pop(self, None)
        super().data_received(data)
        # counted after parsing: a chunk that begins a request resets the count (on_message_begin) and must
        # still count whole, or one big segment holding a request's start and 1 MB of headers passes unseen
        if self._head_timer is not None:  # a request's head is being read (or awaited)
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse_head()

    def _refuse_head(self) -> None:
        self._cancel_head_timer()
        msg = (f"request line and headers are larger than the {self.server_name}'s limit "
               f"({self.limits.max_header_bytes} bytes); send smaller headers").encode()
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8"
                             b"\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(msg), msg))
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline:
            self.idle[self] = None  # waiting for its next request (uvicorn's keep-alive timer runs)


def guarded_protocol(limits: ConnectionLimits, server_name: str = "server") -> type[GuardedHttpToolsProtocol]:
    """A protocol class for one server: its limits, its name in the 431 message, its own idle list."""
    return type(f"Guarded{server_name.title().replace(' ', '')}Protocol", (GuardedHttpToolsProtocol,),
                {"limits": limits, "cap": limits.connection_cap(), "server_name": server_name, "idle": OrderedDict()})


def uvicorn_config(app: Any, limits: ConnectionLimits | None = None, server_name: str = "server",
                   **kwargs: Any) -> uvicorn.Config:
    """A ``uvicorn.Config`` with the guarded protocol and polar's defaults (no lifespan, no access log, no
    ``Server`` header, no proxy headers); ``kwargs`` override them (``log_config=None`` in-process: uvicorn's
    default dictConfig closes every log handler the host installed)."""
    limits = limits or ConnectionLimits()
    options: dict[str, Any] = {
        "lifespan": "off", "access_log": False, "log_level": "warning", "http": guarded_protocol(limits, server_name),
        "timeout_keep_alive": limits.keep_alive_s, "backlog": 2048, "proxy_headers": False, "server_header": False}
    options.update(kwargs)
    return uvicorn.Config(app, **options)


def bind(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 when ``host`` has a colon; port 0: a free one). Bound
    here, before uvicorn starts, so the real port is known and clients that connect before uvicorn's first
    accept wait in the backlog. Raises ``OSError``; callers turn it into their own one-line error."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed, else asyncio's."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class ThreadedUvicorn:
    """uvicorn on its own thread and event loop, serving ``sock``: ``start()`` returns once it accepts
    connections, ``stop()`` shuts it down (gracefully, then forced).

    ``config`` is a ``uvicorn.Config`` or a function that builds one; a function runs on the server's thread
    with its loop current (for an app whose objects must be made on that loop). ``after`` runs on that loop
    once uvicorn has stopped (closing an engine), ``cleanup`` on the thread last, whatever happened."""

    def __init__(self, config: uvicorn.Config | Callable[[], uvicorn.Config], sock: socket.socket, name: str,
                 loop: asyncio.AbstractEventLoop | None = None, after: Callable[[], Awaitable[None]] | None = None,
                 cleanup: Callable[[], None] | None = None) -> None:
        self._config = config
        self.sock = sock
        self.name = name
        self.loop = loop or asyncio.new_event_loop()
        self._after = after
        self._cleanup = cleanup
        self.server: uvicorn.Server | None = None
        self._built = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self.server is not None and self.server.started

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout_s: float = 30.0) -> bool:
        """Start the thread and wait until uvicorn accepts connections; False when it did not within
        ``timeout_s`` or its thread ended first (the caller raises its own error, then calls ``stop``)."""
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        wait = threading.Event()
        for _ in range(max(1, int(timeout_s / 0.01))):
            if self.started or not self._thread.is_alive():
                break
            wait.wait(0.01)
        return self.started

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            try:
                config = self._config() if callable(self._config) else self._config
                self.server = uvicorn.Server(config)
                self._built.set()
                self.loop.run_until_complete(self.server.serve(sockets=[self.sock]))
            finally:  # also after a crash of uvicorn: what ``after`` closes (an engine) is open either way
                if self._after is not None:
                    self.loop.run_until_complete(self._after())
        except Exception:
            log.exception("%s stopped with an error", self.name)
        except BaseException:  # uvloop raises Ctrl-C in this thread too; the owner's stop() cleans up
            log.debug("%s: loop interrupted", self.name, exc_info=True)
        finally:
            self._built.set()
            if self._cleanup is not None:
                self._cleanup()

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Ask uvicorn to stop, wait ``timeout_s``, then force it (open connections are dropped) and wait again;
        then close the loop and the socket. False when the thread is still alive after all that."""
        if self._thread is not None:
            self._built.wait(timeout_s)
        if self.server is not None:
            self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive() and self.server is not None:
                self.server.force_exit = True
                self._thread.join(timeout_s)
        ended = not self.running
        if ended and not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()
        self.sock.close()
        self._thread = None
        return ended


class BodyError(Exception):
    """A request body refused while it was read: ``status`` 413 (over the limit) or 408 (too slow)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


async def read_body(stream: AsyncIterator[bytes], declared: str | None, limit_bytes: int, timeout_s: float,
                    what: str = "the request body") -> bytes:
    """A request body, counted as it streams: refused (413) as soon as it passes ``limit_bytes`` (declared or
    streamed: a chunked body is cut there, never read whole), or (408) when it has not all arrived within
    ``timeout_s`` of its headers, so a body dripped a byte at a time cannot hold its connection."""
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise BodyError(f"{what} is {declared} bytes, over the limit of {limit_bytes}", 413)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in stream:
                size += len(chunk)
                if size > limit_bytes:
                    raise BodyError(f"{what} is over the limit of {limit_bytes} bytes", 413)
                chunks.append(chunk)
    except TimeoutError:
        raise BodyError(f"{what} did not arrive within {timeout_s:g} s ({size} bytes read); send it at once",
                        408) from None
    return b"".join(chunks)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback IP (IPv6 with or without brackets): reachable from this
    machine only."""
    import ipaddress

    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def require_token_off_loopback(host: str, token: str | None, *, exposes: str, token_env: str, token_use: str,
                               error: type[PolarError]) -> bool:
    """The start-up check of ``polar dashboard`` and ``polar serve``: a server on a non-loopback ``host`` needs a
    token, since anyone who reaches it could ``exposes``. Raises ``error`` naming ``$token_env`` (and its
    ``_FILE`` and ``--token-file`` forms); returns whether ``host`` is loopback."""
    loopback = is_loopback(host)
    if not loopback and not token:
        raise error(f"--host {host} is not a loopback address: anyone who reaches it could {exposes}; set "
                    f"${token_env} (or ${token_env}_FILE, or --token-file) to a token {token_use}, or listen on "
                    "127.0.0.1")
    return loopback
