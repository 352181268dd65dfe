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
import socket
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import uvicorn

from polar import httpserver
from polar.config.gateway import GatewayConfig
from polar.errors import GatewayError
from polar.gateway.app import GatewayApp
from polar.gateway.sessions import check_records_dir, key_session_id
from polar.httpserver import ConnectionLimits, GuardedHttpToolsProtocol, new_event_loop
from polar.types import CallRecord

__all__ = ["ConnectionLimits", "GatewayServer", "GuardedHttpToolsProtocol", "build_app", "new_event_loop",
           "serve_forever", "uvicorn_config"]

log = logging.getLogger(__name__)


def build_app(config: GatewayConfig, engine: Any = None, records_dir: str | Path | None = None) -> GatewayApp:
    """The ASGI app around ``engine`` (built from ``config.model`` when not given)."""
    records_dir = records_dir if records_dir is not None else config.records_dir
    check_records_dir(records_dir, config.resume_records)  # before minutes of engine loading
    if engine is None:
        from polar.inference import load_engine

        launch: dict[str, Any] = {}
        if config.engine == "openai_compat":  # a chat endpoint: messages go to it as they are
            launch = {"engine": "openai_compat", "base_url": config.base_url, "api_key_env": config.api_key_env}
        elif config.engine != "embedded":  # polar launches the servers; their logs go beside the records
            default_logs = Path(records_dir).parent / "vllm" if records_dir is not None else Path("runs") / "vllm"
            launch = {"engine": config.engine, "replicas": config.replicas,
                      "log_dir": str(config.engine_log_dir or default_logs)}
        engine = load_engine(config.model, config_key="gateway.model", chat_template=config.chat_template,
                             **launch, **config.engine_kwargs)
    else:  # an engine built elsewhere: the same template choice as load_engine's
        from polar.inference.templates import choose_chat_template

        choose_chat_template(engine, config.chat_template)
    if config.action_cache is not None:
        from polar.inference.action_cache import with_action_cache

        engine = with_action_cache(engine, config.action_cache.max_entries, config.action_cache.max_bytes)
    return GatewayApp(engine, config, records_dir)


def uvicorn_config(app: Any, config: GatewayConfig, limits: ConnectionLimits | None = None,
                   **kwargs: Any) -> uvicorn.Config:
    return httpserver.uvicorn_config(app, limits, "gateway", host=config.host, port=config.port, **kwargs)


def serve_forever(config: GatewayConfig, engine: Any = None, on_listen: Any = None) -> None:
    """Run the gateway in the calling (main) thread until SIGINT/SIGTERM; for ``polar gateway``."""
    app = build_app(config, engine)
    sock = _bind(config)
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


def _bind(config: GatewayConfig) -> socket.socket:
    try:
        return httpserver.bind(config.host, config.port)
    except OSError as e:
        raise GatewayError(f"cannot listen on {config.host}:{config.port}: {e}; pick another port") from None


class GatewayServer:
    """A gateway on a background thread. ``start()`` returns once it accepts connections."""

    def __init__(self, config: GatewayConfig | None = None, engine: Any = None,
                 records_dir: str | Path | None = None, limits: ConnectionLimits | None = None) -> None:
        self.config = config or GatewayConfig()
        self.limits = limits or ConnectionLimits()
        self.app = build_app(self.config, engine, records_dir)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._uv: httpserver.ThreadedUvicorn | None = None
        self.port: int = 0

    @property
    def engine(self) -> Any:
        return self.app.engine

    @property
    def url(self) -> str:
        host = self.config.host if self.config.host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> GatewayServer:
        sock = _bind(self.config)
        self.port = sock.getsockname()[1]
        # in-process: leave the host's logging alone (uvicorn's default dictConfig closes every handler the
        # run installed, e.g. the learner's RUN/logs/ lines)
        config = uvicorn_config(self.app.asgi, self.config, self.limits, log_config=None)
        self._uv = httpserver.ThreadedUvicorn(config, sock, f"polar-gateway:{self.port}", loop=new_event_loop(),
                                              after=lambda: self.app.engine.close(), cleanup=self.app.store.close)
        self.loop = self._uv.loop
        if not self._uv.start(timeout_s):
            self.stop()
            raise GatewayError(f"the gateway did not start within {timeout_s}s (see the log above)")
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._uv is not None:
            self._uv.stop(timeout_s)
            self._uv = None

    def __enter__(self) -> GatewayServer:
        return self.start() if self._uv is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- thread-safe helpers ---------------------------------------------------------------------

    def call(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 600.0) -> Any:
        """Run ``coro`` on the server loop and wait for its result."""
        if self.loop is None or self._uv is None:
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
        """Write every record not yet on disk (they are already readable via ``records``): for a process that
        reads the session files while the gateway runs."""
        self.app.store.flush()
