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
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from polar.errors import GatewayError
from polar.harness.agent.runners import HarnessRunner
from polar.httpserver import ConnectionLimits, ThreadedUvicorn, bind, uvicorn_config
from polar.rollout.sessions.nodes import NodeRegistry
from polar.rollout.sessions.pipeline import PipelineSettings, SessionPipeline, Verifier
from polar.rollout.sessions.service import RolloutService, build_app, service_headers
from polar.rollout.sessions.session import SessionResult
from polar.rollout.sessions.store import SessionStore

if TYPE_CHECKING:
    from polar.config.gateway import GatewayConfig
    from polar.inference.base import Engine

log = logging.getLogger(__name__)


class RolloutServer:
    """The rollout service on a background thread. ``url`` is its HTTP root once started; ``token`` (random,
    in this process's memory only) is what its HTTP API asks of every client (``headers``). It serves through
    :class:`polar.httpserver.ThreadedUvicorn` with the gateway's ``ConnectionLimits`` (``limits``): a client
    dripping headers or holding idle sockets cannot hold the service that hands out every session."""

    def __init__(self, runner: HarnessRunner, verifier: Verifier, settings: PipelineSettings,
                 host: str = "127.0.0.1", port: int = 0, heartbeat_timeout_s: float = 30.0,
                 limits: ConnectionLimits | None = None) -> None:
        self.runner, self.verifier, self.settings = runner, verifier, settings
        self.host, self.port = host, port
        self.limits = limits or ConnectionLimits()
        self.token = secrets.token_urlsafe(32)
        self.registry = NodeRegistry(heartbeat_timeout_s)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pipeline: SessionPipeline | None = None
        self.service: RolloutService | None = None
        self._uv: ThreadedUvicorn | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """What a polar client of this service sends with every request (the run's service token)."""
        return service_headers(self.token)

    def _config(self) -> uvicorn.Config:
        """On the server's thread, its loop current: the pipeline and the service are made on that loop."""
        self.pipeline = SessionPipeline(self.runner, self.verifier, self.registry, self.settings)
        self.service = RolloutService(self.pipeline, self.registry)
        # log_config=None: uvicorn's default dictConfig would close the run's own log handlers
        return uvicorn_config(build_app(self.service, self.token, self.host), self.limits, "rollout service",
                              log_config=None)

    async def _close(self) -> None:
        if self.pipeline is not None:
            await self.pipeline.aclose()
        await self.registry.aclose()

    def start(self, timeout_s: float = 30.0) -> RolloutServer:
        try:
            sock = bind(self.host, self.port)
        except OSError as e:
            raise GatewayError(f"the rollout service cannot listen on {self.host}:{self.port}: "
                               f"{e.strerror or e}; pick another port (0 chooses a free one)") from None
        self.port = sock.getsockname()[1]
        self._uv = ThreadedUvicorn(self._config, sock, f"polar-rollout:{self.port}", after=self._close)
        self.loop = self._uv.loop
        if not self._uv.start(timeout_s):
            self.stop()
            raise GatewayError(f"the rollout service did not start within {timeout_s}s")
        return self

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

        results: list[list[SessionResult]] = self.call(_run(), timeout_s)
        return results

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._uv is not None:
            self._uv.stop(timeout_s)
            self._uv = None
        self.loop = None

    def __enter__(self) -> RolloutServer:
        return self.start() if self._uv is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalStack:
    """Engine + gateway + rollout service for one run. ``run_groups`` collects; ``update_weights`` syncs."""

    def __init__(self, engine: Engine, runner: HarnessRunner, verifier: Verifier, settings: PipelineSettings,
                 records_dir: str | Path | None = None, gateway_config: GatewayConfig | None = None,
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
    def engine(self) -> Engine:
        engine: Engine = self.gateway.engine
        return engine

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

    def run_groups(self, groups: list[tuple[dict[str, Any], int, dict[str, Any]]],
                   timeout_s: float | None = None) -> list[list[SessionResult]]:
        out = self.rollout.run_groups(groups, timeout_s)
        if self.session_store is not None:
            self.session_store.append(r for g in out for r in g)
        return out

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> dict[str, Any]:
        """Through the gateway's drain: pause, wait for in-flight calls, swap, resume, bump the version."""
        report: dict[str, Any] = self.gateway.update_weights(state_dict, version)
        return report

    def stop(self) -> None:
        self.rollout.stop()
        self.gateway.stop()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
