"""Run the gateway in-process (a uvicorn server on its own thread and event loop) or in the foreground.

    with GatewayServer(GatewayConfig(model="tiny"), records_dir="runs/x/gateway/sessions") as gw:
        client = OpenAI(base_url=gw.url + "/s/my-session/v1", api_key="x")
        ...
        gw.update_weights(state_dict, version=1)   # drain, swap, resume
        gw.records("my-session")

The engine's coroutines all run on the server's loop; the thread-safe helpers here hop onto it.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import threading
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from polar.config.gateway import GatewayConfig
from polar.errors import GatewayError
from polar.gateway.app import GatewayApp
from polar.gateway.sessions import check_records_dir, key_session_id
from polar.types import CallRecord

log = logging.getLogger(__name__)


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def build_app(config: GatewayConfig, engine: Any = None, records_dir: str | Path | None = None) -> GatewayApp:
    """The ASGI app around ``engine`` (built from ``config.model`` when not given)."""
    records_dir = records_dir if records_dir is not None else config.records_dir
    check_records_dir(records_dir, config.resume_records)  # before minutes of engine loading
    if engine is None:
        from polar.inference import load_engine

        launch: dict[str, Any] = {}
        if config.engine != "embedded":  # polar launches the servers; their logs go beside the records
            default_logs = Path(records_dir).parent / "vllm" if records_dir is not None else Path("runs") / "vllm"
            launch = {"engine": config.engine, "replicas": config.replicas,
                      "log_dir": str(config.engine_log_dir or default_logs)}
        engine = load_engine(config.model, config_key="gateway.model", chat_template=config.chat_template,
                             **launch, **config.engine_kwargs)
    else:  # an engine built elsewhere: the same template choice as load_engine's
        from polar.inference.templates import choose_chat_template

        choose_chat_template(engine, config.chat_template)
    return GatewayApp(engine, config, records_dir)


@dataclass(frozen=True)
class ConnectionLimits:
    """What one client connection may hold of the gateway (docs/gateway.md, Limits).

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


_TOO_LARGE = b"request line and headers are larger than the gateway's limit (%d bytes); send smaller headers"


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the ``ConnectionLimits`` it lacks: a header deadline from the
    connection's (or the request's) first byte, a header size cap, and a cap on open connections that
    closes the longest-idle one. ``guarded_protocol`` makes one subclass per server (its own idle list)."""

    limits = ConnectionLimits()
    cap = 0
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
        if self._head_timer is not None:  # a request's head is being read (or awaited)
            self._head_bytes += len(data)
        super().data_received(data)
        if self._head_timer is not None and self._head_bytes > self.limits.max_header_bytes:
            self._refuse_head()

    def _refuse_head(self) -> None:
        self._cancel_head_timer()
        msg = _TOO_LARGE % self.limits.max_header_bytes
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


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    return type("GatewayHttpProtocol", (GuardedHttpToolsProtocol,),
                {"limits": limits, "cap": limits.connection_cap(), "idle": OrderedDict()})


def uvicorn_config(app: Any, config: GatewayConfig, limits: ConnectionLimits | None = None,
                   **kwargs: Any) -> uvicorn.Config:
    limits = limits or ConnectionLimits()
    return uvicorn.Config(
        app, host=config.host, port=config.port, lifespan="off", access_log=False, log_level="warning",
        http=guarded_protocol(limits), timeout_keep_alive=limits.keep_alive_s, backlog=2048, proxy_headers=False,
        server_header=False, **kwargs,
    )


def serve_forever(config: GatewayConfig, engine: Any = None, on_listen: Any = None) -> None:
    """Run the gateway in the calling (main) thread until SIGINT/SIGTERM; for ``polar gateway``."""
    app = build_app(config, engine)
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as e:
        sock.close()
        raise GatewayError(f"cannot listen on {config.host}:{config.port}: {e}; pick another port") from None
    sock.listen(2048)  # clients that connect before uvicorn's first accept wait in the backlog, not refused
    host = config.host if config.host not in ("0.0.0.0", "::") else "127.0.0.1"
    url = f"http://{host}:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn_config(app.asgi, config))

    async def serve_and_announce() -> None:
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if server.started and on_listen is not None:
            on_listen(url)  # only once uvicorn accepts: a script may connect the moment it reads the line
        await serving

    loop = new_event_loop()
    try:
        loop.run_until_complete(serve_and_announce())
    except KeyboardInterrupt:  # uvicorn re-raises the signal after its graceful shutdown
        pass
    finally:
        sock.close()
        app.store.close()
    closer = new_event_loop()
    try:
        closer.run_until_complete(app.engine.close())
    finally:
        closer.close()
        if not loop.is_running():
            loop.close()


class GatewayServer:
    """A gateway on a background thread. ``start()`` returns once it accepts connections."""

    def __init__(self, config: GatewayConfig | None = None, engine: Any = None,
                 records_dir: str | Path | None = None, limits: ConnectionLimits | None = None) -> None:
        self.config = config or GatewayConfig()
        self.limits = limits or ConnectionLimits()
        self.app = build_app(self.config, engine, records_dir)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self.port: int = 0

    @property
    def engine(self) -> Any:
        return self.app.engine

    @property
    def url(self) -> str:
        host = self.config.host if self.config.host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> GatewayServer:
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.config.host, self.config.port))
        except OSError as e:
            sock.close()
            raise GatewayError(f"cannot listen on {self.config.host}:{self.config.port}: {e}; pick another port") from None
        self._sock = sock
        self.port = sock.getsockname()[1]
        # in-process: leave the host's logging alone (uvicorn's default dictConfig closes every handler the
        # run installed, e.g. the learner's RUN/logs/ lines)
        self._server = uvicorn.Server(uvicorn_config(self.app.asgi, self.config, self.limits, log_config=None))
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"polar-gateway:{self.port}", daemon=True)
        self._thread.start()
        deadline = threading.Event()
        for _ in range(int(timeout_s / 0.01)):
            if self._server.started or not self._thread.is_alive():
                break
            deadline.wait(0.01)
        if not self._server.started:
            self.stop()
            raise GatewayError(f"the gateway did not start within {timeout_s}s (see the log above)")
        return self

    def _run(self) -> None:
        assert self.loop is not None and self._server is not None
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._server.serve(sockets=[self._sock]))
            self.loop.run_until_complete(self.app.engine.close())
        except Exception:
            log.exception("gateway server stopped with an error")
        except BaseException:  # uvloop raises Ctrl-C in this thread too; the owner's stop() cleans up
            log.debug("gateway loop interrupted", exc_info=True)
        finally:
            self.app.store.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout_s)
        if self.loop is not None and not (self._thread and self._thread.is_alive()) and not self.loop.is_running():
            self.loop.close()
        if self._sock is not None:
            self._sock.close()
        self._thread = None

    def __enter__(self) -> GatewayServer:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- thread-safe helpers ---------------------------------------------------------------------

    def call(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 600.0) -> Any:
        """Run ``coro`` on the server loop and wait for its result."""
        if self.loop is None or self._thread is None:
            coro.close()
            raise GatewayError("the gateway is not running; call start() first")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def pause(self, timeout_s: float = 300.0) -> dict[str, Any]:
        return self.call(self.app.gate.pause(timeout_s))

    def resume(self) -> dict[str, Any]:
        async def _resume() -> dict[str, Any]:
            return self.app.gate.resume()

        return self.call(_resume())

    def update_weights(self, state_dict: Any, version: int, timeout_s: float | None = None) -> dict[str, Any]:
        """Drain in-flight calls (or abort them: ``gateway.sync.in_flight``), swap weights, stamp ``version``
        on later records, resume. ``timeout_s`` defaults to ``gateway.sync.timeout_s``."""
        timeout_s = self.config.sync.timeout_s if timeout_s is None else timeout_s
        return self.call(self.app.update_weights(state_dict, version, timeout_s), timeout_s + 600)

    def records(self, session_id: str) -> list[CallRecord]:
        """The records of session ``session_id``, or of the session the API key ``session_id`` named."""
        store = self.app.store
        return store.records(session_id) or store.records(key_session_id(session_id))

    def flush(self) -> None:
        """Write every record still waiting for its loop turn (they are already readable via ``records``)."""
        self.app.store.flush()
