"""One machine, one command: engine + gateway + session pipeline + rollout service, all in-process.

The gateway runs on its own thread and loop (see :class:`polar.gateway.GatewayServer`); the rollout
service and its pipeline run on a second thread/loop behind a real HTTP port, so remote clients and
extra gateway nodes can join. Synchronous callers (trainers, ``polar generate``) use the blocking
helpers here.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import uvicorn

from polar.errors import GatewayError
from polar.harness.agent.runners import HarnessRunner
from polar.rollout.sessions.nodes import NodeRegistry
from polar.rollout.sessions.pipeline import PipelineSettings, SessionPipeline
from polar.rollout.sessions.service import RolloutService, build_app, service_headers
from polar.rollout.sessions.session import SessionResult
from polar.rollout.sessions.store import SessionStore

log = logging.getLogger(__name__)


class RolloutServer:
    """The rollout service on a background thread. ``url`` is its HTTP root once started; ``token`` (random,
    in this process's memory only) is what its HTTP API asks of every client (``headers``)."""

    def __init__(self, runner: HarnessRunner, verifier: Any, settings: PipelineSettings,
                 host: str = "127.0.0.1", port: int = 0, heartbeat_timeout_s: float = 30.0) -> None:
        self.runner, self.verifier, self.settings = runner, verifier, settings
        self.host, self.port = host, port
        self.token = secrets.token_urlsafe(32)
        self.registry = NodeRegistry(heartbeat_timeout_s)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pipeline: SessionPipeline | None = None
        self.service: RolloutService | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """What a polar client of this service sends with every request (the run's service token)."""
        return service_headers(self.token)

    def start(self, timeout_s: float = 30.0) -> RolloutServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        loop = self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            self.pipeline = SessionPipeline(self.runner, self.verifier, self.registry, self.settings)
            self.service = RolloutService(self.pipeline, self.registry)
            # log_config=None: uvicorn's default dictConfig would close the run's own log handlers
            config = uvicorn.Config(build_app(self.service, self.token, self.host), lifespan="off", access_log=False, log_level="warning",
                                    log_config=None)
            self._server = uvicorn.Server(config)
            ready.set()
            try:
                loop.run_until_complete(self._server.serve(sockets=[sock]))
            finally:
                loop.run_until_complete(self.pipeline.aclose())
                loop.run_until_complete(self.registry.aclose())

        self._thread = threading.Thread(target=run, name=f"polar-rollout:{self.port}", daemon=True)
        self._thread.start()
        ready.wait(timeout_s)
        for _ in range(int(timeout_s / 0.01)):
            if self._server is not None and self._server.started:
                return self
            threading.Event().wait(0.01)
        raise GatewayError(f"the rollout service did not start within {timeout_s}s")

    def call(self, coro: Coroutine[Any, Any, Any], timeout_s: float | None = None) -> Any:
        if self.loop is None:
            coro.close()
            raise GatewayError("the rollout service is not running; call start() first")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def add_node(self, node_id: str, url: str, server: Any = None, capacity: int = 0, static: bool = True,
                 admin_token: str | None = None) -> None:
        async def _add() -> None:
            self.registry.register(node_id, url, capacity=capacity, static=static, server=server,
                                   admin_token=admin_token)

        self.call(_add())

    def run_groups(self, groups: list[tuple[dict[str, Any], int, dict[str, Any]]],
                   timeout_s: float | None = None) -> list[list[SessionResult]]:
        """Submit ``(task, num_samples, metadata)`` groups at once and wait for all; results per group."""

        async def _run() -> list[list[SessionResult]]:
            assert self.service is not None
            ids = [await self.service.submit(t, n, m) for t, n, m in groups]
            states = [await self.service.wait(i) for i in ids]
            return [list(s.results) for s in states]

        return self.call(_run(), timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def __enter__(self) -> RolloutServer:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class LocalStack:
    """Engine + gateway + rollout service for one run. ``run_groups`` collects; ``update_weights`` syncs."""

    def __init__(self, engine: Any, runner: HarnessRunner, verifier: Any, settings: PipelineSettings,
                 records_dir: str | Path | None = None, gateway_config: Any = None,
                 results_dir: str | Path | None = None) -> None:
        from polar.config.gateway import GatewayConfig
        from polar.gateway import GatewayServer

        cfg = gateway_config or GatewayConfig()
        # harnesses may hard-code a model name; the admin token (the config's, else a random one that lives in
        # this process only) locks /admin/* and other sessions' records away from every harness
        cfg = cfg.model_copy(update={"accept_any_model": True, "claimed_sessions_only": True,
                                     "admin_token": cfg.admin_token or secrets.token_urlsafe(32)})
        self.gateway = GatewayServer(cfg, engine=engine, records_dir=records_dir)
        settings.model_name = engine.model_name
        self.rollout = RolloutServer(runner, verifier, settings)
        # finished sessions are kept for people to look at (polar dashboard): RUN/sessions/
        self.session_store = (SessionStore(results_dir, records_dir, getattr(engine, "tokenizer", None))
                              if results_dir is not None else None)

    @property
    def engine(self) -> Any:
        return self.gateway.engine

    def start(self) -> LocalStack:
        self.gateway.start()
        try:
            self.rollout.start()
            self.rollout.add_node("local", self.gateway.url, server=self.gateway,
                                  admin_token=self.gateway.config.admin_token)
        except Exception:
            self.gateway.stop()
            raise
        return self

    def run_groups(self, groups: list[tuple[dict[str, Any], int, dict[str, Any]]], timeout_s: float | None = None):
        out = self.rollout.run_groups(groups, timeout_s)
        if self.session_store is not None:
            self.session_store.append(r for g in out for r in g)
        return out

    def update_weights(self, state_dict: Any, version: int) -> dict[str, Any]:
        """Through the gateway's drain: pause, wait for in-flight calls, swap, resume, bump the version."""
        return self.gateway.update_weights(state_dict, version)

    def stop(self) -> None:
        self.rollout.stop()
        self.gateway.stop()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
