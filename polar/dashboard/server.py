"""The dashboard's HTTP server: uvicorn on a socket bound before it starts, on a thread or in the foreground."""

from __future__ import annotations

import asyncio
from pathlib import Path

import uvicorn

from polar import httpserver
from polar.dashboard.app import LOOPBACK_NAMES, build_app
from polar.errors import PolarError
from polar.httpserver import ConnectionLimits, require_token_off_loopback


class DashboardServer:
    """``polar dashboard`` as an object: ``start()`` serves on a background thread (tests, benchmarks),
    ``serve()`` in the foreground (the CLI). ``url`` is known once the socket is bound."""

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 0,
                 ratings_token: str | None = None, limits: ConnectionLimits | None = None) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise PolarError(f"runs folder {self.root} does not exist or is not a directory; pass the folder "
                             "`polar run` writes into (default: runs)")
        self.host = host
        loopback = require_token_off_loopback(host, ratings_token, exposes="read every run",
                                              token_env="POLAR_DASHBOARD_TOKEN", token_use="the page must present",
                                              error=PolarError)
        # loopback: only loopback Host names (DNS rebinding); elsewhere the token guards every read and write
        self.app = build_app(self.root, ratings_token, LOOPBACK_NAMES if loopback else None,
                             token_for_reads=not loopback)
        try:
            self.sock = httpserver.bind(host, port, backlog=128)
        except OSError as e:
            raise PolarError(f"cannot listen on {host}:{port}: {e.strerror or e}; pick another --port "
                             "(0 chooses a free one)") from None
        self.bound_host, self.port = self.sock.getsockname()[:2]
        # the same connection limits as the gateway's: slow or huge headers and idle sockets are cut
        self.limits = limits or ConnectionLimits(keep_alive_s=5.0)
        self.config = httpserver.uvicorn_config(self.app, self.limits, "dashboard", timeout_graceful_shutdown=1)
        self._threaded: httpserver.ThreadedUvicorn | None = None

    @property
    def url(self) -> str:
        host = f"[{self.bound_host}]" if ":" in self.bound_host else self.bound_host
        return f"http://{host}:{self.port}"

    def serve(self) -> None:
        """In the foreground until SIGINT/SIGTERM (``polar dashboard``)."""
        try:
            asyncio.run(uvicorn.Server(self.config).serve(sockets=[self.sock]))
        finally:
            self.sock.close()

    def start(self, timeout_s: float = 30.0) -> DashboardServer:
        self._threaded = httpserver.ThreadedUvicorn(self.config, self.sock, f"polar-dashboard:{self.port}")
        if not self._threaded.start(timeout_s):
            self.stop()
            raise PolarError(f"the dashboard did not start within {timeout_s}s")
        return self

    def stop(self) -> None:
        if self._threaded is not None:
            self._threaded.stop(10)
            self._threaded = None
        self.sock.close()

    def __enter__(self) -> DashboardServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
